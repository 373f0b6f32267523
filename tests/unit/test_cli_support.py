"""The pieces both commands share: password scrubbing and the one-line-error group."""

from __future__ import annotations

import click
import pytest
from click.testing import CliRunner

from akadze_core.cli.support import OneLineErrorGroup, Secrets


def test_secrets_scrub_the_longest_password_first_then_the_redactors() -> None:
    secrets = Secrets()
    secrets.add_url("postgresql://u:abc@h/db")
    secrets.add_url("postgresql://u:abcdef@h/db")
    secrets.redactors.append(lambda text: text.replace("token", "[token]"))
    assert secrets.scrub("abcdef abc token") == "*** *** [token]"
    secrets.clear()
    assert secrets.scrub("abc") == "abc"


class _Group(OneLineErrorGroup):
    prog_name = "demo"
    secrets = Secrets()

    def begin(self, args: object, extra: object) -> None:
        self.secrets.clear()
        self.secrets.add_url("postgresql://u:hunter2@h/db")


@click.group(cls=_Group)
def demo() -> None:
    """A demo group."""


@demo.command()
def boom() -> None:
    """Fail with a multi-line message that holds the password."""
    raise click.ClickException("cannot log in\nwith hunter2")


@demo.command()
def bug() -> None:
    """Fail with an exception click does not know."""
    raise RuntimeError("oops")


@pytest.mark.parametrize(("command", "line", "code"), [
    ("boom", "demo: error: cannot log in with ***", 1),
    ("bug", "demo: error: unexpected RuntimeError: oops", 1),
    ("nope", "demo: error: No such command 'nope'. (see `demo --help`)", 2),
])
def test_a_failure_is_one_scrubbed_line(command: str, line: str, code: int) -> None:
    result = CliRunner().invoke(demo, [command], prog_name="demo", standalone_mode=True)
    assert result.exit_code == code
    assert result.output.strip() == line


class _KeepsUsageLines(_Group):
    join_usage_errors = False


@click.group(cls=_KeepsUsageLines)
def keeps() -> None:
    """A group that prints click's usage text as it comes, as akadze-compat does."""


@keeps.command()
def usage() -> None:
    """Fail with a two-line usage error that holds the password."""
    raise click.UsageError("bad  usage\nof hunter2")


keeps.add_command(boom)  # other failures are joined whatever the usage setting


@pytest.mark.parametrize(("command", "output", "code"), [
    ("usage", "demo: error: bad  usage\nof *** (see `demo usage --help`)", 2),
    ("boom", "demo: error: cannot log in with ***", 1),
])
def test_a_group_may_keep_usage_errors_as_click_words_them(command: str, output: str,
                                                           code: int) -> None:
    result = CliRunner().invoke(keeps, [command], prog_name="demo", standalone_mode=True)
    assert result.exit_code == code
    assert result.output.strip() == output
