"""What akadze_compat does with each Celery setting, task option, signal and API: the one
source of these claims.

``akadze-compat doctor`` reads these tables to tell a project what will change, and
``migration_guide/celery.md`` is written from them, so a claim lives in one place. Each
entry is a ``Support(status, note)``:

- ``honoured``: takes effect as in Celery (the note may say how it is read);
- ``different``: takes effect, with a difference the note explains;
- ``ignored``: accepted and has no effect here (the note says why, and what to do);
- ``missing``: not there: a signal never sent (its receivers' work silently does not
  happen), an API akadze_compat lacks, or a setting value the worker refuses
  (``setting_value_support``).

``tests/compat/test_doctor.py`` checks the tables against the code: ``SETTING_SUPPORT``
covers exactly ``defaults.DEFAULTS`` and each setting it calls honoured is read somewhere;
the signals it calls sent are exactly those ``akadze_compat`` sends (``.send(``).
``API_PATTERNS`` lists the Celery APIs and call shapes the doctor looks for in a project's
source, with what it says about each.
"""

from __future__ import annotations

from typing import Any, NamedTuple

from akadze_core.integration import AHEAD, AHEAD_BUDGET, SHORT

from ._schedulers import unhonoured_scheduler
from .app.config import database_url
from .app.defaults import NAMESPACES
from .bootsteps import CONSUMER_STEP
from .django_beat import names_database_scheduler
from .exceptions import ImproperlyConfigured
from .serialization import check_accept_content, check_serializer

__all__ = ["API_PATTERNS", "CONSUMER_STEP", "DIFFERENT", "EXTRA_SETTINGS", "HONOURED",
           "IGNORED", "MISSING", "SETTING_SUPPORT", "SIGNAL_SUPPORT", "SYNC_ONLY_OPTIONS",
           "TASK_OPTION_SUPPORT", "Support", "setting_value_support", "task_option_value_support"]

HONOURED, DIFFERENT, IGNORED, MISSING = "honoured", "different", "ignored", "missing"


class Support(NamedTuple):
    """How a Celery setting, option or signal is treated here, and what to know about it."""

    status: str
    note: str


def _h(note: str = "") -> Support:
    return Support(HONOURED, note)


def _d(note: str) -> Support:
    return Support(DIFFERENT, note)


def _i(note: str) -> Support:
    return Support(IGNORED, note)


_PUBLISH_RETRY = ("retried while the database cannot be reached or has no free connection "
                  "(nothing was sent), then kombu's OperationalError; as apply_async(retry=, "
                  "retry_policy=); a connection lost after the insert was sent is not retried")
_RESULTS_IN_POSTGRES = ("results live in the queue's Postgres database, as the job's state and "
                        "value; cleanup follows result_expires")
_NO_BROKER = ("there is no broker connection to tune: the queue is the Postgres database of "
              "broker_url")
_IN_URL = "put it in broker_url, the Postgres URL (user, password, host, port, sslmode...)"
_NO_EVENTS = ("there is no event stream (celery events): task states are rows in the "
              "database; use `akadze-compat inspect`, or `akadze-compat flower` (the "
              "dashboard, which reads the rows)")
_NO_CHORDS = ("chords are not polled: the database releases the body in the transaction that "
              "stores the last member's result (or fails it with ChordError)")
_PREFETCH = ("every pool, as in Celery: the worker holds up to multiplier x processes (or "
             "threads) tasks claimed ahead, plus one running per process (with "
             "task_acks_late, running tasks count in the multiplier); they count as "
             "started; a claimed task waits for a free process or thread, never a busy one; "
             f"0 (no limit) means 4. With prefork, while every recent run took under "
             f"{SHORT * 1000:g} ms it claims up to {AHEAD} more per process (about "
             f"{AHEAD_BUDGET * 1000:g} ms of their work), as Celery's guide advises a higher "
             "multiplier for short tasks")
_AT_LEAST_ONCE = ("delivery is always at least once: the job of a lost worker runs again "
                  "(what acks_late=True gives in Celery)")
_FINAL_FAILURE = "a failed or timed-out task ends FAILURE; it is never put back in the queue"
_GLOBAL_RATE_LIMITS = ("global, where Celery's is per worker: one limit across every "
                       "worker, held in the database (never more starts than the rate in any "
                       "window of its period); jobs over it wait queued without spending an "
                       "attempt (docs/how-to/limits.md)")
_TIME_LIMITS = ("raised inside the body; prefork as Celery's: the soft limit is SIGUSR1 to "
                "the child, which interrupts a blocking call (time.sleep, a socket read), "
                "and at the hard limit the child is killed and replaced, the task FAILURE "
                "with TimeLimitExceeded; threads and solo: async def at its await, plain def "
                "at the next Python bytecode, so a thread blocked in C code sees it only "
                "when the call returns, and a stuck thread cannot be killed (the attempt "
                "ends at the limit plus max(2 s, 5%))")
_NO_STAMPING = ("stamping (StampingVisitor, Signature.stamp, revoke_by_stamped_headers) is "
                "not provided: a sent canvas is jobs in the database and a revoke updates "
                "their rows, so there are no worker-held stamps to match; tag tasks with "
                "headers= and revoke by id (GroupResult.revoke, control.revoke([ids]))")
_LOW_FIRST = "lower numbers run first (RabbitMQ runs higher ones first; Redis, as here, lower)"

#: Status of every setting of a namespace, unless ``_BY_SETTING`` says otherwise.
_BY_NAMESPACE: dict[str, Support] = {
    "beat": _i("beat runs inside every worker, with its state in the database"),
    "broker": _i(_NO_BROKER),
    "control": _i("there are no broadcast queues to tune: remote control goes through the "
                  "database (a request row and NOTIFY; the live workers write their replies)"),
    "event": _i(_NO_EVENTS),
    "result": _i(_RESULTS_IN_POSTGRES),
    "security": _i("message signing (the auth serializer) is not supported: restrict who can "
                   "write the queue's tables with Postgres roles (SECURITY.md)"),
    "task": _i("no meaning without a broker"),
    "worker": _i("no meaning for akadze workers"),
}
_BACKEND_NAMESPACES = ("azureblockblob", "arangodb", "cache", "cassandra", "cosmosdbsql",
                       "couchbase", "database", "elasticsearch", "gcs", "mongodb", "redis", "s3")
_BY_NAMESPACE.update({name: _i(f"a result backend setting: {_RESULTS_IN_POSTGRES}")
                      for name in _BACKEND_NAMESPACES})

_BY_SETTING: dict[str, Support] = {
    "control_queue_ttl": _h("how long a remote-control request waits for its workers to "
                            "take it up"),
    # --- no namespace
    "accept_content": _d("only JSON: any other content type is refused when the app starts"),
    "result_accept_content": _i("results are always JSON"),
    "enable_utc": _h("with no timezone, UTC when on, the local zone when off"),
    "imports": _h("imported when the worker starts"),
    "include": _h("imported when the worker starts"),
    "timezone": _h("naive eta values and crontab schedules are read in it"),
    # --- beat
    "beat_schedule": _h("every worker schedules the entries, each tick enqueued once across "
                        "the fleet; after downtime only the latest missed tick runs; "
                        "intervals tick on a fixed grid since the epoch"),
    "beat_scheduler": _d("schedules come from beat_schedule and add_periodic_task, and from "
                         "django_celery_beat's tables with its DatabaseScheduler; another "
                         "scheduler (RedBeat, any other class) draws one WARNING at worker "
                         "and beat start naming what will not run"),
    "beat_cron_starting_deadline": _i("after downtime only the latest missed tick runs"),
    "beat_max_loop_interval": _i("workers compute the next ticks ahead; there is no loop"),
    # --- broker
    "broker_url": _h("a Postgres URL (postgresql://user:password@host/db)"),
    "broker_host": _d("read as the whole URL when broker_url is unset: set broker_url to a "
                      "Postgres URL instead"),
    "broker_read_url": _i("one database serves reads and writes: set broker_url"),
    "broker_write_url": _i("one database serves reads and writes: set broker_url"),
    "broker_transport_options": _i("no visibility timeout: the jobs of a lost worker go back "
                                   "to the queue when its heartbeat expires"),
    "broker_use_ssl": _i(f"{_IN_URL}: e.g. ?sslmode=verify-full&sslrootcert=..."),
    "broker_login_method": _i(_IN_URL),
    "broker_user": _i(_IN_URL), "broker_password": _i(_IN_URL), "broker_port": _i(_IN_URL),
    "broker_vhost": _i("one database is one queue namespace: use another database or queue "
                       "names"),
    # --- result
    "result_backend": _i(_RESULTS_IN_POSTGRES + "; 'django-db' with django_celery_results "
                         "installed also writes its TaskResult rows, in the outcome's "
                         "transaction"),
    "result_expires": _h("succeeded jobs are deleted that long after they finish (None or 0: "
                         "kept); forget() deletes nothing"),
    "result_failure_expires": _h("failed jobs are deleted that long after they fail (default "
                                 "7 days)"),
    "result_extended": _d("name, args, kwargs, queue and retries are always available; the "
                          "worker that ran it is not recorded"),
    "result_serializer": _d("results are always JSON: a return value that is not JSON fails "
                            "the task with EncodeError"),
    "result_chord_expires": _i(_NO_CHORDS),
    "result_chord_join_timeout": _i(_NO_CHORDS),
    "result_chord_retry_interval": _i(_NO_CHORDS),
    # --- task
    "task_acks_late": _d(f"{_AT_LEAST_ONCE}; it only decides, as in Celery, "
                         "whether the running tasks count in the prefetch window "
                         "(worker_prefetch_multiplier)"),
    "task_acks_on_failure_or_timeout": _i(_FINAL_FAILURE),
    "task_acks_on_failure": _i(_FINAL_FAILURE),
    "task_acks_on_timeout": _i(_FINAL_FAILURE),
    "task_allow_error_cb_on_chord_header": _h("a chord's link_error goes to the header's "
                                              "tasks too (immutable), as in Celery"),
    "task_always_eager": _h("tasks run in the caller, results never stored"),
    "task_annotations": _h("applied when each task is bound to the app, as Celery does "
                           "(attributes, `@method` wrappers, annotation objects)"),
    "task_create_missing_queues": _h("when off, routing to a queue not in task_queues raises "
                                     "QueueNotFound"),
    "task_default_priority": _d(_LOW_FIRST),
    "task_default_queue": _h(),
    "task_default_rate_limit": _d(_GLOBAL_RATE_LIMITS),
    "task_default_delivery_mode": _i("jobs are rows: always durable"),
    "task_default_exchange": _i("no exchanges: tasks go to queues by name (task_routes)"),
    "task_default_exchange_type": _i("no exchanges: tasks go to queues by name (task_routes)"),
    "task_default_routing_key": _i("no exchanges: tasks go to queues by name (task_routes)"),
    "task_eager_propagates": _h(),
    "task_ignore_result": _d("the state (SUCCESS, FAILURE) is still recorded; only the "
                             "return value is dropped"),
    "task_inherit_parent_priority": _h(_LOW_FIRST),
    "task_publish_retry": _h(_PUBLISH_RETRY),
    "task_publish_retry_policy": _h(_PUBLISH_RETRY),
    "task_queue_max_priority": _i(f"any integer priority works; {_LOW_FIRST}"),
    "task_queues": _h("the queue names only (exchanges, bindings and queue arguments do not "
                      "apply); the worker's default -Q"),
    "task_reject_on_worker_lost": _i("the jobs of a lost worker always go back to the queue"),
    "task_retry_on_worker_lost": _i("the jobs of a lost worker always go back to the queue"),
    "task_routes": _h("a route without a queue sends the task to task_default_queue"),
    "task_serializer": _d("only JSON: pickle, yaml and msgpack are refused"),
    "task_soft_time_limit": _d(f"SoftTimeLimitExceeded is {_TIME_LIMITS}"),
    "task_time_limit": _d(f"TimeLimitExceeded is {_TIME_LIMITS}"),
    "task_store_eager_result": _i("eager results are never stored"),
    "task_store_errors_even_if_ignored": _i("the state and error are always stored"),
    "task_track_started": _h(),
    # --- worker
    "worker_concurrency": _h("prefork: processes; threads: tasks at once across the queues"),
    "worker_pool": _h("prefork (children are fresh interpreters, not forks), threads or solo; "
                      "eventlet and gevent run the threads pool"),
    "worker_max_tasks_per_child": _h("prefork only"),
    "worker_max_memory_per_child": _i("not supported: use worker_max_tasks_per_child"),
    "worker_prefetch_multiplier": _h(_PREFETCH),
    "worker_disable_prefetch": _i(f"{_PREFETCH}; set worker_prefetch_multiplier to 1 instead"),
    "worker_enable_prefetch_count_reduction": _i(_PREFETCH),
    "worker_eta_task_limit": _i("tasks with an eta wait in the database, not in worker memory"),
    "worker_disable_rate_limits": _i("rate limits are global, in the database: one worker "
                                     "cannot opt out of them"),
    "worker_hijack_root_logger": _h(),
    "worker_log_format": _h(), "worker_log_datefmt": _h(),
    "worker_task_log_format": _h(), "worker_task_log_datefmt": _h(),
    "worker_log_color": _i("worker output is never colored"),
    "worker_redirect_stdouts": _i("print() output goes to the worker's stdout/stderr as is, "
                                  "but scrubbed of the database password"),
    "worker_redirect_stdouts_level": _i("print() output goes to the worker's stdout/stderr "
                                        "as is, but scrubbed of the database password"),
    "worker_send_task_events": _i(_NO_EVENTS),
    "worker_enable_remote_control": _i("every worker answers remote control (it goes "
                                       "through the database, not a broker queue)"),
    "worker_state_db": _i("revokes live in the database"),
    "worker_deduplicate_successful_tasks": _i(f"{_AT_LEAST_ONCE}; make such tasks idempotent"),
    "worker_soft_shutdown_timeout": _i("at a stop signal running tasks get 10 s to finish, "
                                       "then go back to the queue without spending a retry"),
    "worker_pool_start_method": _i("prefork children are always fresh interpreters"),
}


def _build() -> dict[str, Support]:
    table: dict[str, Support] = {}
    for namespace, (_pattern, options) in NAMESPACES.items():
        for key in options:
            name = f"{namespace}_{key}" if namespace else key
            table[name] = _BY_SETTING.get(name) or _BY_NAMESPACE[namespace]
    return table


#: Every Celery setting (``defaults.DEFAULTS``) -> how akadze_compat treats it.
SETTING_SUPPORT: dict[str, Support] = _build()

#: Settings akadze_compat reads that are not Celery's (so not "unknown" to the doctor).
EXTRA_SETTINGS: dict[str, Support] = {
    "task_default_retry_delay": _h("the retry delay of tasks that set no default_retry_delay"),
}


def setting_value_support(name: str, value: Any) -> Support | None:
    """A value of setting ``name`` that changes its status: one the app refuses at start
    (``missing``), or one with a different effect. None when the table entry applies."""
    try:
        if name == "task_serializer":
            check_serializer(value, name)
        elif name == "accept_content":
            check_accept_content(value, name)
        elif name == "broker_url":
            database_url(value)
    except ImproperlyConfigured as exc:
        return Support(MISSING, f"the worker refuses to start: {exc}")
    if name == "beat_scheduler" and value and names_database_scheduler(value):
        return _d("every worker runs django_celery_beat's periodic tasks from its tables "
                  "(broker_url must be Django's database), each tick once across the fleet; "
                  "intervals tick on the grid of start_time, else of the epoch")
    if name == "beat_scheduler" and value:
        line = unhonoured_scheduler(value)
        if line is not None:
            return Support(MISSING, f"the worker and beat warn at start: {line}")
    if name == "worker_pool" and value:
        pool = str(value).lower()
        if pool in ("eventlet", "gevent"):
            return _d(f"{pool} is not supported: the threads pool runs instead (async def "
                      "tasks run on the worker's event loop)")
        if pool not in ("prefork", "processes", "threads", "solo"):
            return Support(MISSING, f"the worker refuses to start: unknown pool {value!r} "
                                    "(use prefork, threads or solo)")
    return None


# --- task options ------------------------------------------------------------------------

#: Task attributes (``@app.task(...)`` options, class attributes) that do not work as in
#: Celery. The others (max_retries, autoretry_for, retry_backoff, throws, queue, expires,
#: track_started, typing, base handlers, ...) are honoured.
TASK_OPTION_SUPPORT: dict[str, Support] = {
    "rate_limit": _d(_GLOBAL_RATE_LIMITS + "; task_annotations are applied"),
    "acks_late": _i(_AT_LEAST_ONCE),
    "acks_on_failure_or_timeout": _i(_FINAL_FAILURE),
    "reject_on_worker_lost": _i("the jobs of a lost worker always go back to the queue"),
    "store_errors_even_if_ignored": _i("the state and error are always stored"),
    "store_eager_result": _i("eager results are never stored"),
    "send_events": _i(_NO_EVENTS),
    "trail": _i("child results are not tracked (AsyncResult.children is None)"),
    "backend": _i(_RESULTS_IN_POSTGRES),
    "compression": _i("jobs are JSON rows: nothing is compressed"),
    "delivery_mode": _i("jobs are rows: always durable"),
    "exchange": _i("no exchanges: tasks go to queues by name"),
    "routing_key": _i("no exchanges: tasks go to queues by name (kept with the task only)"),
    "ignore_result": _d("the state (SUCCESS, FAILURE) is still recorded; only the return "
                        "value is dropped"),
    "priority": _d(_LOW_FIRST),
    "serializer": _d("only JSON: pickle, yaml and msgpack are refused when the task is sent"),
    "time_limit": _d(f"TimeLimitExceeded is {_TIME_LIMITS}"),
    "soft_time_limit": _d(f"SoftTimeLimitExceeded is {_TIME_LIMITS}"),
}
#: Options whose difference only concerns plain ``def`` bodies (async ones are exact).
SYNC_ONLY_OPTIONS = frozenset({"time_limit", "soft_time_limit"})


def task_option_value_support(option: str, value: Any) -> Support | None:
    """A task option value the app refuses (``missing``); None when the table applies."""
    if option == "serializer":
        try:
            check_serializer(value, "serializer")
        except ImproperlyConfigured as exc:
            return Support(MISSING, f"sending the task fails: {exc}")
    return None


# --- signals -----------------------------------------------------------------------------

#: Every signal of ``akadze_compat.signals`` (and the app's own) -> whether it is sent.
SIGNAL_SUPPORT: dict[str, Support] = {
    "before_task_publish": _d("not sent for periodic runs (the scheduler inserts them in SQL)"),
    "after_task_publish": _d("not sent for periodic runs (the scheduler inserts them in SQL)"),
    "task_prerun": _h(), "task_postrun": _h(), "task_success": _h(), "task_retry": _h(),
    "task_failure": _h("on_failure runs before the state is written"),
    "task_revoked": _d("sent for a task revoked while it runs that then raises, and (prefork) "
                       "with terminated=True and signum, in the worker process, for one "
                       "whose process revoke(terminate=True) ended; a task revoked before "
                       "it starts is cancelled without it"),
    "task_received": _d("sent just before task_prerun, in the process that runs the task "
                        "(a worker claims a job when it can run it: nothing arrives ahead); "
                        "sender is None, request a read-only Request without ack/reject"),
    "task_internal_error": Support(MISSING, "never sent: internal errors end the job FAILED; "
                                            "use task_failure"),
    "task_unknown": Support(MISSING, "never sent: a job whose task the worker does not know "
                                     "fails with 'unknown task'; watch for FAILURE instead"),
    "task_rejected": _i("never sent: there are no raw messages to reject"),
    "task_sent": _i("never sent (deprecated; Celery 5 does not send it either): use "
                    "after_task_publish"),
    "celeryd_init": _h("also in each prefork child (a fresh interpreter, where Celery's is a "
                       "fork of the process that sent it), before worker_process_init"),
    "celeryd_after_setup": _h("sent once the worker is set up"),
    "import_modules": _h(),
    "worker_init": _h("also in each prefork child, before worker_process_init"),
    "worker_ready": _h(),
    "worker_process_init": _h("in each prefork child and in a solo worker"),
    "worker_process_shutdown": _h("in each prefork child"),
    "worker_shutdown": _h(), "worker_shutting_down": _h(),
    "worker_before_create_process": _i("never sent: prefork children are started as fresh "
                                       "interpreters, not forked, so nothing needs closing"),
    "heartbeat_sent": Support(MISSING, "never sent: workers record heartbeats in the database "
                                       "(`akadze-compat status` lists the live ones)"),
    "setup_logging": _h(), "after_setup_logger": _h(), "after_setup_task_logger": _h(),
    "beat_init": Support(MISSING, "never sent: beat runs inside every worker; use worker_ready"),
    "beat_embedded_init": Support(MISSING, "never sent: beat runs inside every worker; use "
                                           "worker_ready"),
    "eventlet_pool_started": Support(MISSING, "never sent: there is no eventlet pool"),
    "eventlet_pool_preshutdown": Support(MISSING, "never sent: there is no eventlet pool"),
    "eventlet_pool_postshutdown": Support(MISSING, "never sent: there is no eventlet pool"),
    "eventlet_pool_apply": Support(MISSING, "never sent: there is no eventlet pool"),
    "user_preload_options": Support(MISSING, "never sent: custom command-line options "
                                             "(app.user_options) are not supported"),
    "app.on_configure": _h(), "app.on_after_configure": _h(), "app.on_after_finalize": _h(),
    "app.on_after_fork": _i("never sent: prefork children are fresh interpreters, not forks; "
                            "module-level set-up runs in each"),
}


# --- APIs --------------------------------------------------------------------------------

_CANVAS = ("runs as in Celery, but sent as one workflow: every task of the canvas is a job "
           "from the start, released by the database when the jobs it waits on succeed; a "
           "chain step after a failure stays PENDING and its get() raises that failure "
           "(migration_guide/celery.md, Canvas)")
_RESULT_ONLY_JOBS = ("then() is not provided (no promises); collect(), iterdeps(), "
                     "get_leaf() and build_graph() are, over children: the canvas jobs "
                     "waiting on the task, not tasks sent from its body")
_GROUP_RESULTS = ("reads every member in one query and waits on LISTEN/NOTIFY; save() "
                  "stores the group in the akadze.saved_groups table")


#: What the doctor's source scan (``doctor_scan``) looks for: the keys are Celery's names, or
#: a short description of a call shape; the status is ``missing`` or ``different``.
API_PATTERNS: dict[str, Support] = {
    "import celery": Support(DIFFERENT, "imports celery: it resolves to akadze_compat through "
                                        "the celery alias, which akadze-compat switches on "
                                        "(elsewhere AKADZE_CELERY=1: "
                                        "migration_guide/third-party.md); importing "
                                        "akadze_compat instead is the explicit path"),
    "unavailable name": Support(MISSING, "does not exist in akadze_compat: this import or "
                                         "attribute fails after the rename"),
    "celery.group": Support(DIFFERENT, f"group: {_CANVAS}"),
    "celery.chain": Support(DIFFERENT, f"chain: {_CANVAS}"),
    "celery.chord": Support(DIFFERENT, f"chord: {_CANVAS}"),
    "celery.chunks": Support(DIFFERENT, f"chunks: {_CANVAS}"),
    "celery.xmap": Support(DIFFERENT, f"xmap: {_CANVAS}"),
    "celery.xstarmap": Support(DIFFERENT, f"xstarmap: {_CANVAS}"),
    "signature | signature": Support(DIFFERENT, f"chaining with |: {_CANVAS}"),
    "Task.map / Task.starmap / Task.chunks": Support(DIFFERENT, _CANVAS),
    "Task.replace": Support(DIFFERENT, "as Celery's (the replacement takes the task id, "
                                       "the chain's rest, chord place, callbacks and "
                                       "errbacks), written in the transaction that ends "
                                       "the task: never lost or sent twice"),
    "Task.add_to_chord": Support(MISSING, "add_to_chord is not supported: a chord's header "
                                          "is fixed when it is sent"),
    "Task.send_event": Support(MISSING, "there is no event stream: record progress with "
                                        "self.update_state()"),
    "link / link_error": Support(DIFFERENT, "run as in Celery, by the database: a callback "
                                            "is a job waiting for the task, an errback is "
                                            "inserted when it fails (called (request, exc, "
                                            "traceback), or (task_id) for one argument)"),
    "celery.result.GroupResult": Support(DIFFERENT, _GROUP_RESULTS),
    "celery.result.ResultSet": Support(DIFFERENT, _GROUP_RESULTS),
    "AsyncResult.then / collect / build_graph": Support(DIFFERENT, _RESULT_ONLY_JOBS),
    "AsyncResult.forget": Support(DIFFERENT, "deletes nothing: the job is removed by "
                                             "result_expires"),
    "revoke(terminate=True)": Support(DIFFERENT, "prefork: the child running the task gets "
                                                 "the signal and is replaced, the task ends "
                                                 "REVOKED without spending a retry; threads "
                                                 "and solo cannot stop a body (nor can "
                                                 "Celery's): it runs on, REVOKED if it then "
                                                 "raises, SUCCESS if it returns"),
    "app.control.inspect": Support(DIFFERENT, "the live workers answer through the database, "
                                              "with Celery's replies; scheduled lists each "
                                              "eta task once, under one worker consuming its "
                                              "queue; revoked lists the last three hours' "
                                              "revokes from the database"),
    "app.control.rate_limit": Support(DIFFERENT, _GLOBAL_RATE_LIMITS + ": the sender sets it "
                                                 "in the database whatever destination says, "
                                                 "and the workers reply as Celery's"),
    "app.control.*": Support(MISSING, "app.control has revoke, purge, inspect, broadcast, "
                                      "ping, shutdown, pool_grow/pool_shrink (threads pool), "
                                      "add_consumer/cancel_consumer, time_limit, "
                                      "rate_limit and enable_events/disable_events (the "
                                      "flag is kept; there is no event stream); not "
                                      "autoscale, election, "
                                      "pool_restart or revoke_by_stamped_headers"),
    "app.control.revoke_by_stamped_headers": Support(MISSING, _NO_STAMPING),
    "celery.canvas.StampingVisitor": Support(MISSING, _NO_STAMPING),
    "celery.bootsteps.ConsumerStep": Support(MISSING, CONSUMER_STEP),
    "app.*": Support(MISSING, "the app has no such attribute here (no broker connection, "
                              "events or pool objects; app.backend and app.amqp answer from "
                              "the database and the settings)"),
    "serializer=": Support(MISSING, "only JSON: pickle, yaml and msgpack are refused when the "
                                    "task is sent"),
    "priority=": Support(DIFFERENT, "lower numbers run first (RabbitMQ runs higher ones first)"),
    "update_state(task_id=...)": Support(DIFFERENT, "only the running task's own state can be "
                                                    "set: other ids are ignored with a "
                                                    "warning"),
    "request.delivery_info": Support(DIFFERENT, "built from the job: exchange and routing_key "
                                                "as sent, queue, priority (lower runs first), "
                                                "redelivered after a lost worker"),
    "request.chain / chord / group": Support(DIFFERENT, "group and group_index are set for a "
                                                        "group's members; chain and chord "
                                                        "are always None (the database "
                                                        "holds what follows)"),
    "celery.contrib": Support(MISSING, "this celery.contrib module is not provided (rdb, "
                                       "migrate, sphinx...; abortable and django.task are): "
                                       "debug and move tasks with the database at hand"),
    "celery.bootsteps": Support(DIFFERENT, "app.steps boot steps run in akadze-compat's "
                                           "worker at Celery's points; consumer steps get the "
                                           "worker (no kombu consumer), a ConsumerStep "
                                           "refuses to start"),
    "celery.schedules.solar": Support(DIFFERENT, "solar schedules run as in Celery when the "
                                                 "ephem package is installed (pip install "
                                                 "'akadze[solar]'); without it the worker "
                                                 "refuses to start, saying so"),
}


# --- the migration guide's statements, written from these tables ------------------------

#: Marks around a generated part of a guide page: ``<!-- support:NAME -->`` ... the text
#: ``fragments()[NAME]`` ... ``<!-- /support:NAME -->``.
_FRAGMENT_START = "<!-- support:{name} (python -m akadze_compat.support --write) -->"
_FRAGMENT_END = "<!-- /support:{name} -->"


_SIGNAL_WORDS = {HONOURED: "sent, as in Celery", DIFFERENT: "sent, with a difference",
                 IGNORED: "never sent", MISSING: "never sent"}


def _signals_fragment() -> str:
    rows = ["| signal | here |", "|---|---|"]
    for name, support in SIGNAL_SUPPORT.items():
        words = _SIGNAL_WORDS[support.status]
        note = support.note.removeprefix("never sent").lstrip(": ")
        rows.append(f"| `{name}` | {words}{': ' + note if note else ''} |")
    return "\n".join(rows)


def _ignored_task_options_fragment() -> str:
    rows = ["| task option | here |", "|---|---|"]
    rows += [f"| `{name}` | {support.status}: {support.note} |"
             for name, support in sorted(TASK_OPTION_SUPPORT.items())]
    return "\n".join(rows)


def fragments() -> dict[str, str]:
    """The generated parts of the migration guide, by name: what these tables say, in the
    words the guide prints."""
    return {"signals": _signals_fragment(), "task-options": _ignored_task_options_fragment()}


def render_page(text: str) -> str:
    """``text`` (a guide page) with every generated part replaced by today's version."""
    import re

    for name, body in fragments().items():
        start = re.escape(_FRAGMENT_START.format(name=name))
        end = re.escape(_FRAGMENT_END.format(name=name))

        def replace(match: re.Match[str], body: str = body) -> str:
            return f"{match.group(1)}{body}\n{match.group(3)}"

        text = re.sub(rf"({start}\n)(.*?)(^{end})", replace, text,
                      flags=re.DOTALL | re.MULTILINE)
    return text


def _main(argv: list[str] | None = None) -> int:
    """``python -m akadze_compat.support``: print a generated part, or rewrite (``--write``)
    or check (``--check``, exit 1 when stale) the parts of the guide pages given."""
    import argparse
    from pathlib import Path

    parser = argparse.ArgumentParser(prog="python -m akadze_compat.support",
                                     description=_main.__doc__)
    parser.add_argument("--markdown", choices=sorted(fragments()),
                        help="print this generated part")
    parser.add_argument("--write", action="store_true", help="rewrite the pages' parts")
    parser.add_argument("--check", action="store_true", help="exit 1 when a page is stale")
    parser.add_argument("pages", nargs="*", type=Path,
                        help="guide pages (default: migration_guide/*.md)")
    options = parser.parse_args(argv)
    if options.markdown:
        print(fragments()[options.markdown])
        return 0
    stale = []
    for page in options.pages or sorted(Path("migration_guide").glob("*.md")):
        text = page.read_text("utf-8")
        rendered = render_page(text)
        if rendered != text:
            stale.append(page)
            if options.write:
                page.write_text(rendered, "utf-8")
    for page in stale:
        print(f"{'rewrote' if options.write else 'stale'}: {page}")
    return 1 if stale and options.check else 0


if __name__ == "__main__":
    raise SystemExit(_main())
