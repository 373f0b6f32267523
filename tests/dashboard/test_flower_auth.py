"""``akadze-compat flower`` never serves open pages because credentials were given in one of
Flower's own spellings: ``--basic_auth=`` / ``--basic-auth``, ``FLOWER_BASIC_AUTH`` and the
other ``FLOWER_*`` variables, ``flowerconfig.py``. OAuth and TLS options it cannot honour stop
it with one line, and an address other than loopback without credentials is refused unless
``--unauthenticated`` says so. Real subprocesses, real HTTP, and Chromium."""

from __future__ import annotations

import base64
import os
import subprocess
import sys
from pathlib import Path

import pytest

from akadze_compat.bin.base import CliError
from akadze_compat.bin.flower import read_flower_options
from tests.dashboard.support import PROJECT_ROOT, Client, chromium, dashboard, free_port

pytestmark = pytest.mark.slow

FLOWER = ("-m", "akadze_compat", "-A", "tests.dashboard.compat_app", "flower")


def _basic(user: str, password: str) -> dict[str, str]:
    token = base64.b64encode(f"{user}:{password}".encode()).decode()
    return {"Authorization": f"Basic {token}"}


def _flower_env(database_url: str, **env: str) -> dict[str, str]:
    clean = {key: value for key, value in os.environ.items()
             if not key.startswith(("FLOWER_", "AKADZE_DASHBOARD_"))}
    return {**clean, "AKADZE_DATABASE_URL": database_url, "PYTHONPATH": str(PROJECT_ROOT),
            **env}


def _run(database_url: str, *args: str, **env: str) -> subprocess.CompletedProcess[str]:
    """The command, expected to stop at once (a refusal)."""
    return subprocess.run([sys.executable, *args], capture_output=True, text=True, timeout=60,
                          cwd=PROJECT_ROOT, env=_flower_env(database_url, **env))


def _refused(done: subprocess.CompletedProcess[str], start: str) -> str:
    assert done.returncode != 0, done.stdout + done.stderr
    lines = [line for line in done.stderr.splitlines() if "error:" in line]
    assert len(lines) == 1, done.stderr
    assert lines[0].split("error: ", 1)[1].startswith(start), lines[0]
    return lines[0]


def test_flowers_spellings_are_read_in_flowers_order(tmp_path: Path) -> None:
    conf = tmp_path / "flowerconfig.py"
    conf.write_text("basic_auth = ['file:pw-file']\nport = 5601\nmax_tasks = 5\n"
                    "import os\nurl_prefix = os.environ['X']\n")
    with pytest.raises(CliError, match="url_prefix is not a plain value"):
        read_flower_options([], {}, tmp_path)
    conf.write_text("basic_auth = ['file:pw-file', 'two:pw-two']\nport = 5601\n"
                    "max_tasks = 5\nimport os\n")
    options = read_flower_options([], {"FLOWER_BASIC_AUTH": "env:pw-env",
                                       "FLOWER_ADDRESS": "0.0.0.0",
                                       "FLOWER_PERSISTENT": "True"}, tmp_path)
    # The file overrides the environment, as in Flower.
    assert options.basic_auth == "file:pw-file,two:pw-two" and options.port == 5601
    assert options.address == "0.0.0.0"
    assert "FLOWER_PERSISTENT" in options.ignored and "flowerconfig.py: max_tasks" in \
        options.ignored
    options = read_flower_options(["--basic_auth=cli:pw-cli", "--url_prefix", "fl",
                                   "--read_only", "--cookie_secret=hush"],
                                  {"FLOWER_BASIC_AUTH": "env:pw-env"}, tmp_path)
    assert options.basic_auth == "cli:pw-cli" and options.url_prefix == "fl"
    assert options.read_only is True
    assert options.ignored[-1] == "--cookie_secret"  # never the secret's value
    for refused in (["--auth=.*@example\\.com"], ["--auth", "x"], ["--auth_provider=a.B"],
                    ["--oauth2-key=k"], ["--certfile=c.pem"]):
        with pytest.raises(CliError, match="flower: --"):
            read_flower_options(refused, {}, tmp_path)
    with pytest.raises(CliError, match="FLOWER_AUTH asks for Flower's OAuth"):
        read_flower_options([], {"FLOWER_AUTH": ".*@corp"}, tmp_path)
    conf.unlink()
    assert read_flower_options(["--auth="], {"FLOWER_AUTH": ""}, tmp_path).basic_auth is None
    with pytest.raises(CliError, match="no such file"):
        read_flower_options(["--conf=missing.py"], {}, tmp_path)


@pytest.mark.parametrize("spelling", ["--basic_auth=admin:pw-admin,ops:pw-ops",
                                      "--basic-auth=admin:pw-admin,ops:pw-ops"])
def test_basic_auth_spellings_require_a_login(database_url: str, tmp_path: Path,
                                              spelling: str) -> None:
    with dashboard(database_url, tmp_path, spelling, command=FLOWER,
                   env={"FLOWER_URL_PREFIX": "flower"}, prefix="/flower") as served:
        assert Client().get(served.base + "/").status == 401
        assert Client(_basic("admin", "wrong")).get(served.base + "/jobs").status == 401
        for user, password in (("admin", "pw-admin"), ("ops", "pw-ops")):
            page = Client(_basic(user, password)).get(served.base + "/jobs")
            assert page.status == 200 and 'href="/flower/workers"' in page.text
        log = served.process.log()
    assert "ignoring unsupported option" not in log and "pw-admin" not in log


def test_flower_environment_and_config_file_require_a_login(
        database_url: str, tmp_path: Path) -> None:
    with dashboard(database_url, tmp_path, command=FLOWER,
                   env={"FLOWER_BASIC_AUTH": "env:pw-env"}) as served:
        assert Client().get(served.base + "/").status == 401
        assert Client(_basic("env", "pw-env")).get(served.base + "/").status == 200
    conf = tmp_path / "flowerconfig.py"
    conf.write_text("basic_auth = ['file:pw-file']\n")
    with dashboard(database_url, tmp_path, f"--conf={conf}", command=FLOWER) as served:
        assert Client().get(served.base + "/").status == 401
        assert Client(_basic("file", "pw-file")).get(served.base + "/").status == 200


def test_auth_it_cannot_honour_stops_it_with_one_line(database_url: str) -> None:
    done = _run(database_url, *FLOWER, "--auth=.*@example\\.com", "--port", str(free_port()))
    line = _refused(done, "flower: --auth asks for Flower's OAuth login")
    assert "example" not in line
    done = _run(database_url, *FLOWER, "--port", str(free_port()),
                FLOWER_AUTH=".*@example\\.com", FLOWER_OAUTH2_SECRET="oauth-secret")
    assert "oauth-secret" not in _refused(done, "flower: FLOWER_AUTH asks")
    done = _run(database_url, *FLOWER, "--port", str(free_port()), "--certfile=c.pem")
    _refused(done, "flower: --certfile asks for TLS")


@pytest.mark.parametrize("command", [FLOWER, ("-m", "akadze_core.cli", "dashboard")])
def test_every_interface_without_credentials_is_refused(database_url: str, tmp_path: Path,
                                                        command: tuple[str, ...]) -> None:
    for address in (("--address", "0.0.0.0"), ("--address=",)):
        done = _run(database_url, *command, *address, "--port", str(free_port()))
        _refused(done, "refusing to serve the dashboard on ")
    if command == FLOWER:
        done = _run(database_url, *command, "--port", str(free_port()),
                    FLOWER_ADDRESS="0.0.0.0")
        _refused(done, "refusing to serve the dashboard on 0.0.0.0")
    # Said explicitly: served (the pages open, the actions off).
    with dashboard(database_url, tmp_path, "--address", "0.0.0.0", "--unauthenticated",
                   command=command) as served:
        assert Client().get(served.base + "/").status == 200
    with dashboard(database_url, tmp_path, "--address", "0.0.0.0", command=command,
                   env={"AKADZE_DASHBOARD_UNAUTHENTICATED": "1"}) as served:
        assert Client().get(served.base + "/").status == 200
    with dashboard(database_url, tmp_path, "--address", "0.0.0.0", command=command,
                   env={"AKADZE_DASHBOARD_BASIC_AUTH": "a:pw-a"}) as served:
        assert Client().get(served.base + "/").status == 401


def test_chromium_gets_no_page_without_the_login(database_url: str, tmp_path: Path) -> None:
    with chromium() as browser, dashboard(
            database_url, tmp_path, "--basic_auth=admin:pw-admin", command=FLOWER,
            env={"FLOWER_URL_PREFIX": "flower"}, prefix="/flower") as served:
        browser.get(served.base + "/jobs")
        # The browser is left at the basic-auth challenge (headless: an empty page), not
        # a dashboard page.
        source = browser.page_source
        assert "/flower/workers" not in source and "akadze" not in source.lower(), source
        host = served.base.removeprefix("http://")
        browser.get(f"http://admin:pw-admin@{host}/jobs")
        assert 'href="/flower/workers"' in browser.page_source
