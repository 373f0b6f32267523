"""WorkerConfig owns the worker's defaults and checks; Worker and `akadze worker --help`
read them from it."""

from __future__ import annotations

from datetime import timedelta

import pytest
from click.testing import CliRunner

from akadze_core import App, Worker, WorkerConfig
from akadze_core.cli.main import cli
from akadze_core.worker.config import DEFAULTS

URL = "postgresql://nobody@127.0.0.1:1/unused"  # never connects here


def test_the_defaults_are_the_seeds() -> None:
    assert DEFAULTS.queues == ("default",)
    assert (DEFAULTS.slots, DEFAULTS.heartbeat_interval, DEFAULTS.heartbeat_ttl,
            DEFAULTS.poll_interval, DEFAULTS.shutdown_timeout, DEFAULTS.fair) == (
        1, 5.0, 30.0, 1.0, 10.0, False)


@pytest.mark.parametrize(("settings", "message"), [
    ({"queues": []}, "a worker needs at least one queue"),
    ({"slots": 0}, "slots must be at least 1 per queue"),
    ({"queues": ["a", "b"], "slots": {"a": 2, "b": 0}}, "slots must be at least 1 per queue"),
    ({"heartbeat_interval": 5, "heartbeat_ttl": timedelta(seconds=5)},
     "heartbeat_ttl must be longer than heartbeat_interval"),
    ({"max_running": 0}, "max_running must be at least 1"),
    ({"concurrency": 0}, "concurrency must be at least 1"),
])
def test_a_bad_setting_raises_the_same_error_from_the_config_and_the_worker(
        settings: dict[str, object], message: str) -> None:
    with pytest.raises(ValueError, match=message):
        WorkerConfig(**settings)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match=message):
        Worker(App(URL), **settings)  # type: ignore[arg-type]


def test_keywords_override_the_config_and_are_checked_with_it() -> None:
    config = WorkerConfig(queues=["a", "b"], slots={"a": 3}, heartbeat_interval=2,
                          heartbeat_ttl=timedelta(seconds=20), name="w")
    worker = Worker(App(URL), config=config, poll_interval=0.5)
    assert worker.queues == ["a", "b"]
    assert worker.slots == {"a": 3, "b": 1}
    assert (worker.heartbeat_interval, worker.heartbeat_ttl, worker.poll_interval) == (
        2.0, 20.0, 0.5)
    assert worker.name == "w"
    assert worker.config.poll_interval == 0.5 and config.poll_interval == 1.0
    with pytest.raises(ValueError, match="heartbeat_ttl must be longer"):
        Worker(App(URL), config=config, heartbeat_interval=20)


def test_the_worker_commands_help_prints_the_configs_defaults() -> None:
    text = " ".join(CliRunner().invoke(cli, ["worker", "--help"]).output.split())
    assert f"Concurrent runs per queue. [default: {DEFAULTS.slots}]" in text
    assert f"Seconds between heartbeats. [default: {DEFAULTS.heartbeat_interval:g}]" in text
    assert f"is dead. [default: {DEFAULTS.heartbeat_ttl:g}]" in text
    assert f"when idle. [default: {DEFAULTS.poll_interval:g}]" in text
    assert f"on stop. [default: {DEFAULTS.shutdown_timeout:g}]" in text


def test_the_lock_timeout_is_two_seconds_and_never_long_enough_to_look_dead() -> None:
    assert DEFAULTS.lock_timeout_seconds() == 2.0
    # A short TTL shortens it: a heartbeat that gave up on a lock must leave room for the
    # next one within the TTL.
    assert WorkerConfig(heartbeat_interval=0.2, heartbeat_ttl=1.5).lock_timeout_seconds() \
        == pytest.approx(0.65)
    assert WorkerConfig(lock_timeout=timedelta(seconds=3)).lock_timeout_seconds() == 3.0
    for bad in (0, 25, 40):
        with pytest.raises(ValueError, match="lock_timeout must be"):
            WorkerConfig(lock_timeout=bad)


def test_max_connections_sizes_the_pool_less_the_listen_connection() -> None:
    assert WorkerConfig(slots=4).pool_size() == 10  # min(4, 16) + 6; + LISTEN = 11
    assert WorkerConfig(slots=100).pool_size() == 22
    assert WorkerConfig(slots=100, max_connections=5).pool_size() == 4
    with pytest.raises(ValueError, match="max_connections must be at least 3"):
        WorkerConfig(max_connections=2)


def test_metrics_are_off_unless_a_port_is_given_and_bind_this_host_by_default() -> None:
    app = App("postgresql://nowhere.invalid/x")
    assert Worker(app).metrics is None
    worker = Worker(app, config=WorkerConfig(metrics_port=0))
    assert worker.metrics is not None
    assert worker.config.metrics_address == "127.0.0.1"
    with pytest.raises(ValueError, match="metrics_port must be a TCP port"):
        WorkerConfig(metrics_port=70000)


def test_the_config_is_the_second_argument_and_keywords_build_or_override_it() -> None:
    config = WorkerConfig(queues=["a"], slots=2, name="w")
    worker = Worker(App(URL), config, prune_batch=10)
    assert (worker.queues, worker.slots, worker.name) == (["a"], {"a": 2}, "w")
    assert worker.config.prune_batch == 10 and config.prune_batch == 1000
    assert Worker(App(URL), queues=["b"]).config == WorkerConfig(queues=["b"])
    with pytest.raises(TypeError, match="config is a WorkerConfig"):
        Worker(App(URL), ["a"])  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="no_such_setting"):
        Worker(App(URL), no_such_setting=1)


def test_the_defaults_the_worker_derives_are_the_configs() -> None:
    config = WorkerConfig(queues=["a", "b"], slots={"a": 30})
    assert config.pending_outcomes_limit() == 4 * 31
    assert WorkerConfig().pending_outcomes_limit() == 100
    assert WorkerConfig(max_pending_outcomes=7).pending_outcomes_limit() == 7
    assert WorkerConfig(name="n").worker_name() == "n"
    assert ":" in WorkerConfig().worker_name()


def test_the_worker_and_its_rooms_import_in_no_circle() -> None:
    """Counting TYPE_CHECKING imports: a room that imported the worker back (or a panel
    typed by it) would make them one module in two files."""
    from tests import package_structure

    modules = package_structure.load(package="akadze_core")
    graph = package_structure.module_graph(modules, in_functions=True, type_checking=True)
    rooms = {name for name in modules if name.startswith("akadze_core.worker.")}
    caught = [circle for circle in package_structure.cycles(graph) if rooms & set(circle)]
    assert caught == []
