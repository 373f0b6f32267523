"""app.conf: Celery's names, defaults, old names, namespaces, sources read live."""

from __future__ import annotations

import sys
import types
from collections.abc import Iterator
from datetime import timedelta
from typing import Any

import pytest

from akadze_compat import Celery
from akadze_compat.app.config import Settings, import_object
from akadze_compat.app.defaults import DEFAULTS, TO_NEW_NAME, TO_OLD_NAME, find
from tests.compat import config_cases
from tests.compat.celery_reference import run_celery


@pytest.fixture
def settings_module() -> Iterator[types.ModuleType]:
    module = types.ModuleType("akadze_test_settings")
    module.CELERY_TASK_ALWAYS_EAGER = True  # type: ignore[attr-defined]
    module.CELERY_BROKER_URL = "postgresql://localhost/x"  # type: ignore[attr-defined]
    module.config = {"task_default_queue": "from-dict"}  # type: ignore[attr-defined]
    sys.modules[module.__name__] = module
    yield module
    del sys.modules[module.__name__]


def app(**config: Any) -> Celery:
    return Celery("proj", set_as_current=False, **config)


def test_defaults() -> None:
    conf = app().conf
    assert conf.task_default_queue == "celery"
    assert conf["task_always_eager"] is False
    assert conf.result_expires == timedelta(days=1)
    assert conf.worker_prefetch_multiplier == 4
    assert conf.accept_content == ("json",)
    assert conf.broker_url is None
    with pytest.raises(AttributeError):
        conf.no_such_setting  # noqa: B018


def test_keywords_become_settings_and_conf_is_mutable() -> None:
    celery = app(task_default_queue="q", broker="postgresql://h/db")
    conf = celery.conf
    assert conf.task_default_queue == "q"
    assert conf.broker_url == "postgresql://h/db"
    conf.task_always_eager = True
    conf.update(task_default_queue="other", worker_concurrency=4)
    conf["task_ignore_result"] = True
    assert (conf.task_always_eager, conf["task_default_queue"], conf.worker_concurrency,
            conf.task_ignore_result) == (True, "other", 4, True)
    assert conf.setdefault("task_default_queue", "ignored") == "other"
    assert conf.setdefault("custom_thing", 1) == 1


def test_old_names() -> None:
    celery = app()
    celery.config_from_object(config_cases.OldStyle)
    conf = celery.conf
    assert conf.task_always_eager is True
    assert conf.task_default_queue == "legacy"
    assert conf.worker_concurrency == 3
    assert conf.task_routes == {"a.b": "q"}
    assert conf.broker_url == "postgresql://localhost/old"
    assert conf.task_eager_propagates is True
    assert conf.task_time_limit == 60
    assert conf["CELERY_ALWAYS_EAGER"] is True
    assert conf["CELERYD_CONCURRENCY"] == 3


def test_old_names_as_keywords_and_updates() -> None:
    conf = app(CELERY_ALWAYS_EAGER=True).conf
    assert conf.task_always_eager is True
    conf.update(CELERY_ROUTES={"a": "b"})
    assert conf.task_routes == {"a": "b"}


def test_namespace(settings_module: types.ModuleType) -> None:
    celery = app()
    celery.config_from_object("akadze_test_settings", namespace="CELERY")
    assert celery.conf.task_always_eager is True
    assert celery.conf.broker_url == "postgresql://localhost/x"
    assert celery.conf.task_default_queue == "celery"  # default: not set in the module


def test_namespace_with_old_names() -> None:
    celery = app(namespace="CELERY")
    celery.config_from_object(config_cases.DjangoOldNames)
    assert celery.conf.task_always_eager is True
    assert celery.conf.task_routes == {"x": "old"}
    assert celery.conf.worker_concurrency == 2


@pytest.mark.parametrize("source", [
    "akadze_test_settings", "akadze_test_settings:config", "akadze_test_settings.config",
])
def test_source_strings(settings_module: types.ModuleType, source: str) -> None:
    celery = app()
    celery.config_from_object(source)
    expected = "from-dict" if source.endswith("config") else "celery"
    assert celery.conf.task_default_queue == expected


def test_sources_are_read_live(settings_module: types.ModuleType) -> None:
    celery = app()
    celery.config_from_object("akadze_test_settings", namespace="CELERY")
    assert celery.conf.task_always_eager is True
    settings_module.CELERY_TASK_ALWAYS_EAGER = False  # type: ignore[attr-defined]
    assert celery.conf.task_always_eager is False
    mapping = {"task_default_queue": "a"}
    celery.config_from_object(mapping)
    mapping["task_default_queue"] = "b"
    assert celery.conf.task_default_queue == "b"


def test_changes_win_over_the_source() -> None:
    celery = app(task_default_queue="from-keyword")
    celery.config_from_object({"task_default_queue": "from-source"})
    assert celery.conf.task_default_queue == "from-keyword"


def test_source_is_imported_lazily() -> None:
    celery = app()
    celery.config_from_object("akadze_no_such_module_anywhere")
    with pytest.raises(ImportError):
        celery.conf.task_default_queue  # noqa: B018
    quiet = app()
    quiet.config_from_object("akadze_no_such_module_anywhere", silent=True)
    assert quiet.conf.task_default_queue == "celery"


def test_on_after_configure_fires_once() -> None:
    celery = app()
    seen: list[Any] = []

    def receiver(sender: Any = None, source: Any = None, **kwargs: Any) -> None:
        seen.append((sender, source.task_default_queue))

    celery.on_after_configure.connect(receiver, weak=False)
    celery.config_from_object({"task_default_queue": "q"})
    assert celery.conf.task_default_queue == "q"
    assert celery.conf.task_always_eager is False
    assert seen == [(celery, "q")]


def test_add_defaults() -> None:
    celery = app()
    celery.add_defaults(lambda: {"task_default_queue": "added", "my_setting": 1})
    assert celery.conf.task_default_queue == "added"
    assert celery.conf.my_setting == 1
    celery.conf.task_default_queue = "set"
    assert celery.conf.task_default_queue == "set"


def test_broker_url_environment_wins(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("CELERY_BROKER_URL", "postgresql://env/db")
    assert app(broker="postgresql://kw/db").conf.broker_url == "postgresql://env/db"


def test_timezone_falls_back_to_django_time_zone() -> None:
    celery = app()
    celery.config_from_object({"TIME_ZONE": "Europe/Paris"})
    assert celery.conf.timezone == "Europe/Paris"
    assert str(celery.timezone) == "Europe/Paris"


def test_find_value_for_key_and_helpers() -> None:
    conf = app(worker_concurrency=7).conf
    assert conf.find_value_for_key("concurrency", "worker") == 7
    assert conf.find_value_for_key("always_eager", "task") is False
    assert conf.get_by_parts("worker", "concurrency") == 7
    assert find("always_eager", "task") == ("task", "always_eager", False)
    assert conf.first("task_default_rate_limit", "task_default_queue") == "celery"
    assert conf.value_set_for("worker_concurrency")
    assert not conf.value_set_for("task_default_queue")


def test_table_hides_secrets() -> None:
    conf = app(broker="postgresql://u:secret@h/db", task_default_queue="q").conf
    table = conf.table()
    assert table["broker_url"] == "********"
    assert table["task_default_queue"] == "q"
    assert "secret" not in conf.humanize()


def test_settings_can_be_used_alone() -> None:
    settings = Settings({"CELERY_ALWAYS_EAGER": True})
    assert settings.task_always_eager is True
    assert "task_always_eager" in settings
    assert "nothing_like_this" not in settings


def test_import_object() -> None:
    assert import_object("os.path:join") is import_object("os.path.join")
    with pytest.raises(ImportError):
        import_object("os.no_such_thing")


CELERY_DEFAULTS_SCRIPT = """
import json
from celery.app.defaults import DEFAULTS, _TO_OLD_KEY
print(json.dumps({"defaults": {k: repr(v) for k, v in DEFAULTS.items()}, "old": _TO_OLD_KEY}))
"""


def test_every_celery_setting_is_known_with_its_default_and_old_name() -> None:
    celery = run_celery(CELERY_DEFAULTS_SCRIPT)
    assert set(celery["defaults"]) == set(DEFAULTS)
    assert {key: repr(value) for key, value in DEFAULTS.items()} == celery["defaults"]
    assert celery["old"] == TO_OLD_NAME
    assert all(TO_NEW_NAME[old] == new for new, old in TO_OLD_NAME.items())


CELERY_LOOKUP_SCRIPT = """
import json
from celery import Celery
from tests.compat import config_cases

results = []
for source, namespace in config_cases.SCENARIOS:
    app = Celery("proj", set_as_current=False)
    app.config_from_object(getattr(config_cases, source), namespace=namespace)
    results.append({key: repr(getattr(app.conf, key)) for key in config_cases.KEYS})
print(json.dumps(results))
"""


def test_same_values_as_celery_for_each_source() -> None:
    expected = run_celery(CELERY_LOOKUP_SCRIPT)
    ours = []
    for source, namespace in config_cases.SCENARIOS:
        celery = app()
        celery.config_from_object(getattr(config_cases, source), namespace=namespace)
        ours.append({key: repr(getattr(celery.conf, key)) for key in config_cases.KEYS})
    assert ours == expected
