"""``akadze-compat doctor`` reports the Celery add-ons installed and whether the celery alias
is on, in its text and its JSON."""

from __future__ import annotations

import json
from importlib import metadata

import pytest

from akadze_compat.addons import ADDONS
from tests.compat.cli_harness import run


def installed() -> dict[str, str]:
    found = {}
    for addon in ADDONS:
        try:
            found[addon.distribution] = metadata.version(addon.distribution)
        except metadata.PackageNotFoundError:
            continue
    return found


def test_the_json_report_lists_the_installed_addons_and_the_switch() -> None:
    done = run("-A", "plainproj", "doctor", "--json")
    report = json.loads(done.stdout)
    assert {item["distribution"]: item["version"] for item in report["addons"]} == installed()
    assert all(item["guide"].startswith("migration_guide/third-party.md#")
               for item in report["addons"])
    assert report["celery_alias"]["on"] is True  # the command turns it on
    assert report["celery_alias"]["celery_is"] == "akadze_compat"


def test_with_the_switch_refused_the_report_says_it_is_off() -> None:
    done = run("-A", "plainproj", "doctor", "--json", env={"AKADZE_CELERY": "0"})
    report = json.loads(done.stdout)
    assert report["celery_alias"]["on"] is False
    assert report["celery_alias"]["env"] == "0"


def test_the_text_report_has_an_addons_section() -> None:
    if not installed():
        pytest.skip("no add-on installed (the test extra pins them)")
    done = run("-A", "plainproj", "doctor")
    text = done.stdout
    section = text[text.index("\nCelery add-ons\n"):text.index("\nSummary:")]
    assert "celery alias: on: `import celery` resolves to akadze_compat" in section
    for distribution, version in installed().items():
        assert f"  {distribution} {version}: see migration_guide/third-party.md#" in section


def test_every_addon_has_its_section_in_the_guide() -> None:
    import re
    from pathlib import Path

    guide = Path(__file__).resolve().parents[2] / "migration_guide" / "third-party.md"
    anchors = {re.sub(r"[^\w\- ]", "", heading.strip().lower()).replace(" ", "-")
               for heading in re.findall(r"^#+ (.+)$", guide.read_text(), re.MULTILINE)}
    assert {addon.anchor for addon in ADDONS} <= anchors
