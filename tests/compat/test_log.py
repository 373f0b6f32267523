"""akadze_compat.utils.log (and akadze_compat.utils): Celery's logging helpers."""

from __future__ import annotations

import logging
import re
import uuid as uuid_module
from collections.abc import Iterator

import pytest

from akadze_compat import utils
from akadze_compat.utils import log
from tests.compat.differential import observed


def unique(prefix: str) -> str:
    """A logger name no other test uses (loggers are process-global)."""
    return f"{prefix}{uuid_module.uuid4().hex[:8]}"


def parents(logger: logging.Logger) -> list[str]:
    names = []
    current = logger.parent
    while current is not None:
        names.append(current.name)
        current = current.parent
    return names


@pytest.fixture
def celery_task_level() -> Iterator[logging.Logger]:
    """The "celery.task" logger, its level restored afterwards."""
    task_root = logging.getLogger("celery.task")
    saved = task_root.level
    yield task_root
    task_root.setLevel(saved)


def test_hierarchy_roots() -> None:
    assert log.base_logger is logging.getLogger("celery")
    assert log.task_logger is logging.getLogger("celery.task")
    assert log.worker_logger is logging.getLogger("celery.worker")
    assert parents(log.task_logger) == ["celery", "root"]


def test_task_logger_keeps_its_name_under_celery_task() -> None:
    name = unique("proj.tasks_")
    logger = log.get_task_logger(name)
    assert logger.name == name
    assert parents(logger) == ["celery.task", "celery", "root"]
    assert log.get_task_logger(name) is logger


def test_task_logger_follows_celery_task_configuration(
    celery_task_level: logging.Logger, caplog: pytest.LogCaptureFixture
) -> None:
    logger = log.get_task_logger(unique("proj.levels_"))
    celery_task_level.setLevel(logging.ERROR)
    with caplog.at_level(logging.DEBUG):  # the root accepts everything; celery.task filters
        logger.warning("filtered")
        logger.error("kept")
    assert [record.getMessage() for record in caplog.records] == ["kept"]
    assert [record.name for record in caplog.records] == [logger.name]


@pytest.mark.parametrize("name", ["celery", "celery.task"])
def test_reserved_names(name: str) -> None:
    with pytest.raises(RuntimeError, match="is reserved"):
        log.get_task_logger(name)


def test_get_logger_attaches_below_celery_unless_top_level() -> None:
    top_level = log.get_logger(unique("standalone_"))
    assert parents(top_level) == ["root"]
    under = log.get_logger(f"celery.{unique('custom_')}")
    assert parents(under) == ["celery", "root"]
    existing = unique("existing_")
    logging.getLogger(existing)
    child = log.get_logger(f"{existing}.child")
    assert parents(child) == ["celery", "root"]  # Celery's rule, odd as it is


def test_loggers_get_a_null_handler() -> None:
    # As in Celery: records are not printed by logging's last-resort handler.
    logger = log.get_task_logger(unique("proj.quiet_"))
    assert [type(handler) for handler in logger.handlers] == [logging.NullHandler]


@pytest.mark.parametrize(
    ("level", "number"),
    [("info", 20), ("DEBUG", 10), ("warn", 30), ("Fatal", 50), (10, 10), (None, None), ("", "")],
)
def test_mlevel(level: int | str | None, number: int | str | None) -> None:
    assert log.mlevel(level) == number


def test_mlevel_unknown_name() -> None:
    with pytest.raises(KeyError):
        log.mlevel("chatty")


def test_log_levels_table() -> None:
    assert log.LOG_LEVELS["WARNING"] == logging.WARNING
    assert log.LOG_LEVELS[logging.WARNING] == "WARNING"
    assert log.LOG_LEVELS["FATAL"] == logging.CRITICAL


def test_uuid() -> None:
    values = [utils.uuid() for _ in range(2000)]
    for value in values:  # what str(uuid.uuid4()) gives: version 4, RFC 4122 variant
        parsed = uuid_module.UUID(value)
        assert (str(parsed), parsed.version, parsed.variant) == (
            value, 4, uuid_module.RFC_4122)
    assert len(set(values)) == len(values)
    # Every random digit shows up in every random position (none is stuck).
    for position in (0, 15, 19, 35):
        assert len({value[position] for value in values}) == (4 if position == 19 else 16)
    assert utils.gen_unique_id is utils.uuid


# --- differential: the same observations made on Celery 5.7 -------------------------------

KEYS = [
    "base_logger", "task_logger", "worker_logger", "task_module", "task_module_again",
    "task_top_level", "task_under_celery", "plain_top_level", "plain_dotted_orphan",
    "plain_under_celery", "by_logger_object", "plain_dotted_with_parent",
    "task_dotted_with_parent", "reserved", "reserved_message", "mlevel", "LOG_LEVELS",
    "effective",
]


@pytest.mark.parametrize("key", KEYS)
def test_matches_celery(key: str) -> None:
    celery, ours = observed("log")
    assert ours[key] == celery[key]


def test_probe_keys_are_all_compared() -> None:
    celery, ours = observed("log")
    assert sorted(celery) == sorted(ours) == sorted(KEYS)


def test_a_task_logs_its_real_runtime_as_celery_does(caplog: pytest.LogCaptureFixture) -> None:
    from akadze_compat import Celery

    app = Celery("proj", set_as_current=False)

    @app.task
    def double(x: int) -> int:
        return 2 * x

    caplog.set_level(logging.INFO, logger="celery.app.trace")
    result = double.apply((3,))
    lines = [record.getMessage() for record in caplog.records
             if record.name == "celery.app.trace"]
    # Celery's LOG_SUCCESS: the runtime as a plain float, not rounded to milliseconds.
    assert len(lines) == 1, lines
    found = re.fullmatch(rf"Task {double.name}\[{result.id}\] succeeded in (\S+)s: 6", lines[0])
    assert found, lines[0]
    assert 0 < float(found.group(1)) < 1 and found.group(1) != "0.0"
    app.close()
