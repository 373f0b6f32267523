"""Every Celery 5 setting: its name, its default, and its pre-4.0 upper-case name.

Settings are grouped by namespace (``task``, ``worker``, ...): the setting name is
``<namespace>_<key>``. Old names follow one pattern per namespace (``CELERYD_CONCURRENCY``
for ``worker_concurrency``, ``CELERY_ALWAYS_EAGER`` for ``task_always_eager``, ...) with the
exceptions listed in ``_OLD_NAME_EXCEPTIONS``. Most settings only need to be *accepted*
(they configure brokers and result backends we do not have); ``support.SETTING_SUPPORT``
says which ones take effect. ``tests/compat/test_config.py`` checks this table against Celery's.
"""

from __future__ import annotations

from datetime import timedelta
from typing import Any, NamedTuple

__all__ = ["DEFAULTS", "NAMESPACES", "SETTING_KEYS", "TO_NEW_NAME", "TO_OLD_NAME", "find"]

PROCESS_LOG_FORMAT = "[%(asctime)s: %(levelname)s/%(processName)s] %(message)s"
TASK_LOG_FORMAT = ("[%(asctime)s: %(levelname)s/%(processName)s] "
                   "%(task_name)s[%(task_id)s]: %(message)s")

# namespace -> (pattern of the old names, {key: default}). A pattern of None means the old
# name is the new name in upper case; "" is the settings without a namespace.
NAMESPACES: dict[str, tuple[str | None, dict[str, Any]]] = {
    "": (None, {
        "accept_content": ("json",), "result_accept_content": None, "enable_utc": True,
        "imports": (), "include": (), "timezone": None,
    }),
    "beat": ("CELERYBEAT_{}", {
        "enable_remote_control": False, "remote_control_max_tick_age": None,
        "max_loop_interval": 0, "schedule": {}, "scheduler": "celery.beat:PersistentScheduler",
        "schedule_filename": "celerybeat-schedule", "sync_every": 0,
        "cron_starting_deadline": None,
    }),
    "broker": (None, {
        "url": None, "read_url": None, "write_url": None, "transport": None,
        "transport_options": {}, "connection_timeout": 4, "connection_retry": True,
        "connection_retry_on_startup": None, "connection_max_retries": 100,
        "channel_error_retry": False, "failover_strategy": None, "heartbeat": 120,
        "heartbeat_checkrate": 3.0, "login_method": None,
        "native_delayed_delivery_queue_type": "quorum", "pool_limit": 10,
        "pool_acquire_timeout": None, "use_ssl": False, "host": None, "port": None,
        "user": None, "password": None, "vhost": None,
    }),
    "cache": ("CELERY_CACHE_{}", {"backend": None, "backend_options": {}}),
    "cassandra": (None, {
        "entry_ttl": None, "keyspace": None, "port": None, "read_consistency": None,
        "servers": None, "bundle_path": None, "table": None, "write_consistency": None,
        "auth_provider": None, "auth_kwargs": None, "options": {},
    }),
    "s3": (None, {
        "access_key_id": None, "secret_access_key": None, "bucket": None, "base_path": None,
        "endpoint_url": None, "region": None,
    }),
    "azureblockblob": (None, {
        "container_name": "celery", "retry_initial_backoff_sec": 2, "retry_increment_base": 2,
        "retry_max_attempts": 3, "base_path": "", "connection_timeout": 20,
        "read_timeout": 120,
    }),
    "gcs": (None, {"bucket": None, "project": None, "base_path": "", "ttl": 0}),
    "control": (None, {
        "queue_ttl": 300.0, "queue_expires": 10.0, "queue_exclusive": True,
        "queue_durable": False, "exchange": "celery",
    }),
    "couchbase": ("CELERY_COUCHBASE_{}", {"backend_settings": None}),
    "arangodb": ("CELERY_ARANGODB_{}", {"backend_settings": None}),
    "mongodb": ("CELERY_MONGODB_{}", {"backend_settings": None}),
    "cosmosdbsql": (None, {
        "database_name": "celerydb", "collection_name": "celerycol",
        "consistency_level": "Session", "max_retry_attempts": 9, "max_retry_wait_time": 30,
    }),
    "event": ("CELERY_EVENT_{}", {
        "queue_expires": 60.0, "queue_ttl": 5.0, "queue_prefix": "celeryev",
        "queue_exclusive": True, "queue_durable": False, "serializer": "json",
        "exchange": "celeryev",
    }),
    "redis": ("CELERY_REDIS_{}", {
        "backend_use_ssl": None, "db": None, "host": None, "max_connections": None,
        "username": None, "password": None, "port": None, "socket_timeout": 120.0,
        "socket_connect_timeout": None, "retry_on_timeout": False, "socket_keepalive": False,
    }),
    "result": ("CELERY_RESULT_{}", {
        "backend": None, "cache_max": -1, "compression": None, "exchange": "celeryresults",
        "exchange_type": "direct", "expires": timedelta(days=1), "chord_expires": None,
        "failure_expires": None, "persistent": None, "extended": False, "serializer": "json",
        "backend_transport_options": {}, "chord_retry_interval": 1.0,
        "chord_join_timeout": 3.0, "backend_max_sleep_between_retries_ms": 10000,
        "backend_max_retries": float("inf"), "backend_base_sleep_between_retries_ms": 10,
        "backend_always_retry": False,
    }),
    "elasticsearch": ("CELERY_ELASTICSEARCH_{}", {
        "retry_on_timeout": None, "max_retries": None, "timeout": None,
        "save_meta_as_text": True,
    }),
    "security": ("CELERY_SECURITY_{}", {
        "certificate": None, "cert_store": None, "key": None, "key_password": None,
        "digest": "sha256",
    }),
    "database": (None, {
        "url": None, "engine_options": {"pool_pre_ping": True, "pool_recycle": 3600},
        "engine_callback": None, "short_lived_sessions": False, "table_schemas": None,
        "table_names": None, "create_tables_at_setup": True,
    }),
    "task": ("CELERY_{}", {
        "acks_late": False, "acks_on_failure_or_timeout": True, "acks_on_failure": None,
        "acks_on_timeout": None, "always_eager": False, "annotations": None,
        "compression": None, "create_missing_queues": True,
        "create_missing_queue_type": "classic", "create_missing_queue_exchange_type": None,
        "inherit_parent_priority": False, "default_delivery_mode": 2,
        "default_queue": "celery", "default_queue_type": "classic", "default_exchange": None,
        "default_exchange_type": "direct", "default_routing_key": None,
        "default_rate_limit": None, "default_priority": None, "eager_propagates": False,
        "ignore_result": False, "store_eager_result": False, "protocol": 2,
        "publish_retry": True,
        "publish_retry_policy": {"max_retries": 3, "interval_start": 0, "interval_max": 1,
                                 "interval_step": 0.2},
        "queues": None, "queue_max_priority": None, "reject_on_worker_lost": None,
        "retry_on_worker_lost": False, "remote_tracebacks": False, "repr_maxlevels": 3,
        "routes": None, "send_sent_event": False, "serializer": "json",
        "soft_time_limit": None, "time_limit": None, "store_errors_even_if_ignored": False,
        "track_started": False, "allow_error_cb_on_chord_header": False,
    }),
    "worker": ("CELERYD_{}", {
        "agent": None, "autoscaler": "celery.worker.autoscale:Autoscaler",
        "cancel_long_running_tasks_on_connection_loss": False, "soft_shutdown_timeout": 0.0,
        "enable_soft_shutdown_on_idle": False, "concurrency": None,
        "consumer": "celery.worker.consumer:Consumer", "direct": False,
        "disable_rate_limits": False, "deduplicate_successful_tasks": False,
        "enable_remote_control": True, "hijack_root_logger": True, "log_color": None,
        "log_datefmt": None, "log_format": PROCESS_LOG_FORMAT, "lost_wait": 10.0,
        "max_memory_per_child": None, "max_tasks_per_child": None, "pool": "prefork",
        "pool_putlocks": True, "pool_restarts": False, "pool_start_method": "fork",
        "proc_alive_timeout": 4.0, "prefetch_multiplier": 4, "eta_task_limit": None,
        "enable_prefetch_count_reduction": True, "disable_prefetch": False,
        "redirect_stdouts": True, "redirect_stdouts_level": "WARNING",
        "send_task_events": False, "state_db": None, "task_log_datefmt": None,
        "task_log_format": TASK_LOG_FORMAT, "timer": None, "timer_precision": 1.0,
        "detect_quorum_queues": True,
    }),
}

# Old names that do not follow their namespace's pattern.
_OLD_NAME_EXCEPTIONS = {
    "accept_content": "CELERY_ACCEPT_CONTENT",
    "imports": "CELERY_IMPORTS",
    "include": "CELERY_INCLUDE",
    "timezone": "CELERY_TIMEZONE",
    "result_cache_max": "CELERY_MAX_CACHED_RESULTS",
    "result_expires": "CELERY_TASK_RESULT_EXPIRES",
    "database_url": "CELERY_RESULT_DBURI",
    "database_engine_options": "CELERY_RESULT_ENGINE_OPTIONS",
    "database_short_lived_sessions": "CELERY_RESULT_DB_SHORT_LIVED_SESSIONS",
    "database_table_names": "CELERY_RESULT_DB_TABLENAMES",
    "task_compression": "CELERY_MESSAGE_COMPRESSION",
    "task_eager_propagates": "CELERY_EAGER_PROPAGATES_EXCEPTIONS",
    "task_protocol": "CELERY_TASK_PROTOCOL",
    "task_publish_retry": "CELERY_TASK_PUBLISH_RETRY",
    "task_publish_retry_policy": "CELERY_TASK_PUBLISH_RETRY_POLICY",
    "task_send_sent_event": "CELERY_SEND_TASK_SENT_EVENT",
    "task_serializer": "CELERY_TASK_SERIALIZER",
    "task_soft_time_limit": "CELERYD_TASK_SOFT_TIME_LIMIT",
    "task_time_limit": "CELERYD_TASK_TIME_LIMIT",
    "worker_direct": "CELERY_WORKER_DIRECT",
    "worker_disable_rate_limits": "CELERY_DISABLE_RATE_LIMITS",
    "worker_enable_remote_control": "CELERY_ENABLE_REMOTE_CONTROL",
    "worker_lost_wait": "CELERYD_WORKER_LOST_WAIT",
    "worker_redirect_stdouts": "CELERY_REDIRECT_STDOUTS",
    "worker_redirect_stdouts_level": "CELERY_REDIRECT_STDOUTS_LEVEL",
    "worker_send_task_events": "CELERY_SEND_EVENTS",
}


def _build() -> tuple[dict[str, Any], dict[str, str]]:
    defaults: dict[str, Any] = {}
    to_old: dict[str, str] = {}
    for namespace, (pattern, options) in NAMESPACES.items():
        for key, default in options.items():
            name = f"{namespace}_{key}" if namespace else key
            defaults[name] = default
            if name in _OLD_NAME_EXCEPTIONS:
                to_old[name] = _OLD_NAME_EXCEPTIONS[name]
            elif pattern is not None:
                to_old[name] = pattern.format(key.upper())
            else:
                to_old[name] = name.upper()
    return defaults, to_old


#: Every setting's default, by its (new, lower-case) name.
DEFAULTS, TO_OLD_NAME = _build()
#: Old upper-case name -> new name.
TO_NEW_NAME: dict[str, str] = {old: new for new, old in TO_OLD_NAME.items()}
#: Every (new) setting name.
SETTING_KEYS = frozenset(DEFAULTS)


class SearchResult(NamedTuple):
    """Where ``find`` found a setting: its namespace, its key in it, and its default."""

    namespace: str | None
    key: str
    default: Any


def find(name: str, namespace: str = "celery") -> SearchResult:
    """Find a setting by its short name, preferring ``namespace`` (like Celery's ``find``).

    ``find("always_eager", "task")`` and ``find("task_always_eager")`` both give
    ``("task", "always_eager", False)``. Raises KeyError for unknown names.
    """
    key, preferred = name.lower(), namespace.lower()
    if preferred in NAMESPACES and key in NAMESPACES[preferred][1]:
        return SearchResult(preferred, key, NAMESPACES[preferred][1][key])
    for other, (_, options) in NAMESPACES.items():
        if other and key in options:
            return SearchResult(other, key, options[key])
    for other, (_, options) in NAMESPACES.items():
        prefix = f"{other}_" if other else ""
        if prefix and key.startswith(prefix) and key[len(prefix):] in options:
            return SearchResult(other, key[len(prefix):], options[key[len(prefix):]])
    if key in NAMESPACES[""][1]:
        return SearchResult(None, key, NAMESPACES[""][1][key])
    raise KeyError(name)
