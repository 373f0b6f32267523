"""The pieces both commands share: password scrubbing and the one-line-error group."""

from __future__ import annotations

import click
import pytest
from click.testing import CliRunner

from akadze_core import App
from akadze_core.cli.support import OneLineErrorGroup, Secrets
from akadze_core.model.dsn import BY_SUBSTRINGS, by_substrings


def test_secrets_scrub_the_longest_password_first_then_the_redactors() -> None:
    secrets = Secrets()
    secrets.add_url("postgresql://u:abc@h/db")
    secrets.add_url("postgresql://u:abcdef@h/db")
    secrets.redactors.append(lambda text: text.replace("token", "[token]"))
    assert secrets.scrub("abcdef abc token") == "*** *** [token]"
    secrets.clear()
    assert secrets.scrub("abc") == "abc"


@pytest.mark.parametrize("texts", [
    ["job 1 t.quick succeeded", "job 2 t.quick succeeded", ""],
    ["a postgresql://u:pw@h/db b", "clean"],
    ["host=h password=pw", "clean"],
    ["clean", "it is abcdef here", "and abc"],
    ["ends with abc", "def starts"],  # a password split over two texts: in neither
    ["password", "= x", "postgresql://u", ":pw@h"],  # shapes split over two texts
    ["line\nwith a newline password", "=y", "token"],
    [],
])
@pytest.mark.parametrize("redactor", [True, False])
def test_secrets_scrub_lines_is_scrub_of_each(texts: list[str], redactor: bool) -> None:
    # What is looked for once in the join of the texts finds what scrub finds in each
    # alone, and nothing more; each redactor still sees each text on its own.
    secrets = Secrets()
    secrets.add_url("postgresql://u:abc@h/db")
    secrets.add_url("postgresql://u:abcdef@h/db")
    seen: list[str] = []
    if redactor:
        def redact(text: str) -> str:
            seen.append(text)
            return text.replace("token", "[token]")
        secrets.redactors.append(redact)
    expected = [secrets.scrub(text) for text in texts]
    seen_alone = list(seen)
    seen.clear()
    assert secrets.scrub_lines(texts) == expected
    assert seen == seen_alone


@pytest.mark.parametrize("texts", [
    ["job 1 t.quick succeeded", "job 2 t.quick succeeded"],
    ["job 1 t.quick succeeded", "a token here", "token"],
    ["ends with tok", "en starts"],  # a needle split over two texts: in neither
    [],
])
def test_a_substring_redactor_is_asked_once_for_lines_it_leaves_as_they_are(
        texts: list[str]) -> None:
    secrets = Secrets()
    seen: list[str] = []

    @by_substrings
    def redact(text: str) -> str:
        seen.append(text)
        return text.replace("token", "[token]")

    secrets.redactors.append(redact)
    expected = [secrets.scrub(text) for text in texts]
    seen.clear()
    assert secrets.scrub_lines(texts) == expected
    joined = "\n".join(texts)
    # The join first; each text alone only when the join changed.
    assert seen == ([joined] if "token" not in joined else [joined, *texts])


def test_an_apps_redact_scrubs_lines_as_it_scrubs_each() -> None:
    app = App(database_url="postgresql://u:s3cretpw@h/db")
    assert getattr(app.redact, BY_SUBSTRINGS)
    secrets = Secrets()
    secrets.redactors.append(app.redact)
    texts = ["job 1 t succeeded", "login as s3cretpw failed", "clean"]
    assert secrets.scrub_lines(texts) == ["job 1 t succeeded", "login as *** failed", "clean"]
    assert secrets.scrub_lines(texts[::2]) == texts[::2]


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
