"""Celery's result backend classes (``celery.backends.base``), for code that names them.

akadze keeps a task's state and result in its job row: ``app.backend`` reads that row
(``backends.database.DatabaseBackend``) whatever ``result_backend`` says, and the worker
never hands a result to a backend class. These classes are here for the packages and projects
that import or subclass them: django_celery_results' backends (``BaseDictBackend``,
``KeyValueStoreBackend``), celery-progress's ``KnownResult`` (``DisabledBackend``'s state
sets), a project's own backend. Their methods work as Celery's do when called (a subclass's
``_store_result``/``_get_task_meta_for``, or ``get``/``set`` for a key-value store), with
the facade's JSON serializer; nothing in akadze calls them.
"""

from __future__ import annotations

from typing import Any

from .. import serialization, states
from ..exceptions import TaskRevokedError

__all__ = ["Backend", "BaseBackend", "BaseDictBackend", "BaseKeyValueStoreBackend",
           "DisabledBackend", "KeyValueStoreBackend", "SyncBackendMixin"]

#: Celery's message when results are read from an app without a backend.
E_NO_BACKEND = ("No result backend is configured. Please see the documentation for more "
                "information.")


class Backend:
    """Celery's ``Backend``: result storage by task id, through ``_store_result`` and
    ``_get_task_meta_for`` (a subclass's)."""

    READY_STATES = states.READY_STATES
    UNREADY_STATES = states.UNREADY_STATES
    EXCEPTION_STATES = states.EXCEPTION_STATES
    supports_native_join = False
    supports_autoexpire = False
    persistent = True
    subpolling_interval: float | None = None
    serializer = "json"
    content_type = "application/json"
    content_encoding = "utf-8"

    def __init__(self, app: Any = None, serializer: str | None = None,
                 max_cached_results: int | None = None, accept: Any = None,
                 expires: Any = None, expires_type: Any = None, url: str | None = None,
                 **kwargs: Any) -> None:
        self.app = app
        self.url = url
        self.expires = expires
        self.accept = accept
        self._cache: dict[str, dict[str, Any]] = {}

    def as_uri(self, include_password: bool = False) -> str:
        """The backend's URL (``url``), as configured."""
        return self.url or ""

    # --- encoding ----------------------------------------------------------------------------

    def encode(self, data: Any) -> str:
        """``data`` in the facade's JSON."""
        return serialization.dumps(data)

    def decode(self, payload: Any) -> Any:
        """The value ``encode`` made."""
        return serialization.loads(payload)

    def _encode(self, data: Any) -> tuple[str, str, str]:
        return self.content_type, self.content_encoding, self.encode(data)

    def prepare_exception(self, exc: BaseException, serializer: str | None = None) \
            -> dict[str, Any]:
        """Celery's JSON form of an exception."""
        return {"exc_type": type(exc).__name__, "exc_message": list(exc.args),
                "exc_module": type(exc).__module__}

    def prepare_value(self, result: Any) -> Any:
        """The value stored for ``result``."""
        return result

    def encode_result(self, result: Any, state: str) -> Any:
        """``result`` as stored in ``state``: an exception in its JSON form."""
        if state in self.EXCEPTION_STATES and isinstance(result, BaseException):
            return self.prepare_exception(result)
        return self.prepare_value(result)

    def _get_result_meta(self, result: Any, state: str, traceback: Any, request: Any,
                         format_date: bool = True, encode: bool = False) -> dict[str, Any]:
        return {"status": state, "result": result, "traceback": traceback,
                "children": [], "date_done": None,
                "task_id": getattr(request, "id", None)}

    # --- storing and reading -----------------------------------------------------------------

    def _store_result(self, task_id: str, result: Any, state: str, traceback: Any = None,
                      request: Any = None, **kwargs: Any) -> Any:
        raise NotImplementedError("a backend stores results in _store_result")

    def _get_task_meta_for(self, task_id: str) -> dict[str, Any]:
        raise NotImplementedError("a backend reads results in _get_task_meta_for")

    def store_result(self, task_id: str, result: Any, state: str, traceback: Any = None,
                     request: Any = None, **kwargs: Any) -> Any:
        """Store ``result`` of ``task_id`` in ``state`` (through ``_store_result``)."""
        encoded = self.encode_result(result, state)
        self._cache.pop(task_id, None)
        self._store_result(task_id, encoded, state, traceback, request=request, **kwargs)
        return result

    def mark_as_started(self, task_id: str, **meta: Any) -> Any:
        return self.store_result(task_id, meta, states.STARTED)

    def mark_as_done(self, task_id: str, result: Any, request: Any = None,
                     store_result: bool = True, state: str = states.SUCCESS) -> None:
        if store_result:
            self.store_result(task_id, result, state, request=request)

    def mark_as_failure(self, task_id: str, exc: BaseException, traceback: Any = None,
                        request: Any = None, store_result: bool = True,
                        call_errbacks: bool = True, state: str = states.FAILURE) -> None:
        if store_result:
            self.store_result(task_id, exc, state, traceback=traceback, request=request)

    def mark_as_retry(self, task_id: str, exc: BaseException, traceback: Any = None,
                      request: Any = None, store_result: bool = True,
                      state: str = states.RETRY) -> Any:
        return self.store_result(task_id, exc, state, traceback=traceback, request=request)

    def mark_as_revoked(self, task_id: str, reason: str = "", request: Any = None,
                        store_result: bool = True, state: str = states.REVOKED) -> None:
        if store_result:
            self.store_result(task_id, TaskRevokedError(reason), state, request=request)

    def get_task_meta(self, task_id: str, cache: bool = True) -> dict[str, Any]:
        """The stored meta of ``task_id`` (cached once ready, as Celery does)."""
        if cache and task_id in self._cache:
            return self._cache[task_id]
        meta = self._get_task_meta_for(task_id)
        if cache and meta.get("status") in self.READY_STATES:
            self._cache[task_id] = meta
        return meta

    def get_state(self, task_id: str) -> str:
        return str(self.get_task_meta(task_id)["status"])

    get_status = get_state

    def get_result(self, task_id: str) -> Any:
        return self.get_task_meta(task_id).get("result")

    def get_traceback(self, task_id: str) -> Any:
        return self.get_task_meta(task_id).get("traceback")

    def get_children(self, task_id: str) -> Any:
        return self.get_task_meta(task_id).get("children")

    def forget(self, task_id: str) -> None:
        self._cache.pop(task_id, None)
        self._forget(task_id)

    def _forget(self, task_id: str) -> None:
        raise NotImplementedError("backend does not implement forget.")

    def reload_task_result(self, task_id: str) -> None:
        self._cache[task_id] = self.get_task_meta(task_id, cache=False)

    def cleanup(self) -> None:
        """Backend cleanup (nothing here)."""

    def process_cleanup(self) -> None:
        """Cleanup at the end of a task (nothing here)."""

    def on_task_call(self, producer: Any, task_id: str) -> dict[str, Any]:
        return {}

    def ensure_chords_allowed(self) -> None:
        """Chords are allowed."""


class SyncBackendMixin:
    """Celery's mixin of backends read by polling (nothing more to it here)."""


class BaseBackend(Backend, SyncBackendMixin):
    """Celery's ``BaseBackend``."""


#: Celery's old name for ``BaseBackend``.
BaseDictBackend = BaseBackend


class BaseKeyValueStoreBackend(Backend):
    """Celery's key-value store backend: a subclass gives ``get``, ``set``, ``mget`` and
    ``delete``; the meta of a task is stored under ``celery-task-meta-<id>``."""

    key_t = str
    task_keyprefix = "celery-task-meta-"
    group_keyprefix = "celery-taskset-meta-"
    chord_keyprefix = "chord-unlock-"

    def get(self, key: str) -> Any:
        raise NotImplementedError("Must implement the get method.")

    def mget(self, keys: list[str]) -> Any:
        raise NotImplementedError("Does not support get_many")

    def set(self, key: str, value: Any) -> Any:
        raise NotImplementedError("Must implement the set method.")

    def delete(self, key: str) -> Any:
        raise NotImplementedError("Must implement the delete method")

    def get_key_for_task(self, task_id: str, key: str = "") -> str:
        """The key of ``task_id``'s meta."""
        return f"{self.task_keyprefix}{task_id}{key}"

    def _store_result(self, task_id: str, result: Any, state: str, traceback: Any = None,
                      request: Any = None, **kwargs: Any) -> Any:
        meta = self._get_result_meta(result, state, traceback, request)
        meta["task_id"] = task_id
        self.set(self.get_key_for_task(task_id), self.encode(meta))
        return result

    def _get_task_meta_for(self, task_id: str) -> dict[str, Any]:
        stored = self.get(self.get_key_for_task(task_id))
        if not stored:
            return {"status": states.PENDING, "result": None}
        meta = self.decode(stored)
        return meta if isinstance(meta, dict) else {"status": states.PENDING, "result": None}

    def _forget(self, task_id: str) -> None:
        self.delete(self.get_key_for_task(task_id))


class KeyValueStoreBackend(BaseKeyValueStoreBackend, SyncBackendMixin):
    """Celery's ``KeyValueStoreBackend``."""


class DisabledBackend(BaseBackend):
    """Celery's backend of an app without results: storing does nothing, reading raises."""

    def store_result(self, *args: Any, **kwargs: Any) -> Any:
        """Nothing is stored."""
        return None

    def ensure_chords_allowed(self) -> None:
        raise NotImplementedError("Starting chords requires a result backend to be "
                                  "configured, but none have been configured")

    def _is_disabled(self, *args: Any, **kwargs: Any) -> Any:
        raise NotImplementedError(E_NO_BACKEND)

    def as_uri(self, include_password: bool = False) -> str:
        return "disabled://"

    get_state = get_status = get_result = get_traceback = _is_disabled  # type: ignore[assignment]
    get_task_meta_for = wait_for = get_many = _is_disabled
