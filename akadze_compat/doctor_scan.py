"""The source scan of ``akadze-compat doctor``: Celery APIs a project uses that akadze lacks
or changes, found with ``ast`` (the files are parsed, never run).

``support.API_PATTERNS`` is the table of what is looked for, with the message the doctor
prints; ``scan_source`` finds the uses in one file. Names are matched whether the project imports
them from ``akadze_compat`` or still from ``celery`` (both read as Celery's names), and any
``from akadze_compat.x import y`` that does not exist in akadze_compat is reported too.
"""

from __future__ import annotations

import ast
import importlib
import importlib.util
from collections.abc import Iterable
from dataclasses import dataclass
from functools import lru_cache
from types import ModuleType
from typing import Any

from .app.base import Celery
from .exceptions import ImproperlyConfigured
from .serialization import check_serializer
from .support import API_PATTERNS

__all__ = ["ApiUse", "exists_in_facade", "scan_source"]

#: Patterns that stand for a module and everything in it.
_MODULE_PATTERNS = ("celery.contrib", "celery.bootsteps")
#: Keys of API_PATTERNS that describe a call shape, not a Celery name.
_NOT_NAMES = frozenset({"import celery", "unavailable name"})
_RESULT_GRAPH = frozenset({"then", "collect", "build_graph", "iterdeps", "get_leaf"})
#: What app.control has, as Celery's (inspect and rate_limit are reported as different).
_CONTROL_HAS = frozenset({"revoke", "purge", "broadcast", "ping", "shutdown", "pool_grow",
                          "pool_shrink", "add_consumer", "cancel_consumer", "time_limit"})
_SIGNATURE_CALLS = frozenset({"s", "si", "signature", "subtask"})
#: Calls that take Celery's execution options (serializer=, priority=, link=...).
_OPTION_CALLS = frozenset({"apply_async", "send_task", "signature", "subtask", "set",
                           "retry", "apply", "Signature"})
_TASK_DECORATORS = frozenset({"task", "shared_task"})
_BOUND_TASK_ONLY = {"replace": "Task.replace", "add_to_chord": "Task.add_to_chord",
                    "send_event": "Task.send_event"}
_RESULT_MAKERS = frozenset({"delay", "apply_async", "send_task", "AsyncResult"})


@dataclass(frozen=True)
class ApiUse:
    """One use of a pattern of ``API_PATTERNS``: where, and what (the name or call shape)."""

    pattern: str
    line: int
    detail: str


def _celery_name(module: str) -> str | None:
    """``akadze_compat.x`` and ``celery.x`` as Celery's name ``celery.x``; None otherwise."""
    for root in ("akadze_compat", "celery"):
        if module == root or module.startswith(f"{root}."):
            return "celery" + module[len(root):]
    return None


@lru_cache(maxsize=512)
def exists_in_facade(name: str) -> bool:
    """Whether Celery's ``name`` (``celery.x.y``) exists in akadze_compat: the longest module
    prefix is imported (akadze_compat's own modules only) and the next part looked up."""
    parts = ["akadze_compat", *name.split(".")[1:]]
    module: Any = importlib.import_module("akadze_compat")
    for index in range(1, len(parts)):
        if parts[index].startswith("__"):
            return True  # dunder modules (__main__) are never imported here
        candidate = ".".join(parts[:index + 1])
        try:
            value = getattr(module, parts[index], None)
        except ImportError:
            return False  # a name Celery has that akadze_compat refuses (utils.unsupported)
        if value is not None and not isinstance(value, ModuleType):
            return True  # an attribute: what it holds is not looked into
        if isinstance(value, ModuleType):
            module = value
            continue
        try:
            found = importlib.util.find_spec(candidate) is not None
        except (ImportError, ValueError):
            found = False
        if not found:
            return False
        module = importlib.import_module(candidate)
    return True


def _pattern_for(name: str) -> str | None:
    """The API_PATTERNS key a Celery name (or an attribute of one: ``group.apply_async``)
    falls under, if any."""
    parts = name.split(".")
    for end in range(len(parts), 1, -1):
        prefix = ".".join(parts[:end])
        if prefix.startswith("celery.canvas.") and end == 3:
            prefix = f"celery.{parts[2]}"
        if prefix in API_PATTERNS and prefix not in _NOT_NAMES:
            return prefix
        if prefix in _MODULE_PATTERNS:
            return prefix
    return None


def _missing_pattern(name: str) -> str | None:
    """``_pattern_for(name)``, but None for a name of a module pattern that akadze_compat
    provides after all (``celery.contrib.abortable`` under ``celery.contrib``)."""
    pattern = _pattern_for(name)
    if pattern in _MODULE_PATTERNS and exists_in_facade(name):
        return None
    return pattern


def _dotted(node: ast.AST) -> list[str] | None:
    """``a.b.c`` as ``["a", "b", "c"]`` (None for anything but names and attributes)."""
    parts: list[str] = []
    while isinstance(node, ast.Attribute):
        parts.append(node.attr)
        node = node.value
    if not isinstance(node, ast.Name):
        return None
    return [node.id, *reversed(parts)]


def _is_true(node: ast.AST | None) -> bool:
    return isinstance(node, ast.Constant) and node.value is True


class _Scanner(ast.NodeVisitor):
    """Walks one module; ``uses`` collects what it finds."""

    def __init__(self, tree: ast.Module, module: str, task_names: frozenset[str],
                 app_refs: frozenset[tuple[str, str]], app_attributes: frozenset[str]) -> None:
        self.uses: list[ApiUse] = []
        self.module = module
        self.app_refs = app_refs
        #: Local name -> Celery name (``group`` -> ``celery.group``).
        self.aliases: dict[str, str] = {}
        #: Local names of modules that are not Celery's (``os``, ``gc``): never results.
        self.other_modules: set[str] = set()
        self.task_names = set(task_names)
        #: Local names of the Celery app: where the project defines it, what imports it.
        self.app_names = {name for where, name in app_refs
                          if module in (where, f"{where}.__init__")}
        self.app_attributes = app_attributes
        self.result_names: set[str] = set()
        #: The ``self`` of the bound tasks (and Task methods) being visited, innermost last.
        self.bound: list[str] = []
        self._prepare(tree)

    # --- the first pass: imports, apps, tasks, results ---------------------------------------

    def _prepare(self, tree: ast.Module) -> None:
        for node in ast.walk(tree):
            if isinstance(node, ast.Import):
                for alias in node.names:
                    name = _celery_name(alias.name)
                    local = alias.asname or alias.name.split(".")[0]
                    if name is None:
                        self.other_modules.add(local)
                    else:
                        self.aliases[local] = name if alias.asname else "celery"
            elif isinstance(node, ast.ImportFrom):
                source = self._absolute(node)
                module = _celery_name(source) if node.level == 0 else None
                for alias in node.names:
                    local = alias.asname or alias.name
                    if module is not None and alias.name != "*":
                        self.aliases[local] = f"{module}.{alias.name}"
                    elif (source, alias.name) in self.app_refs:
                        self.app_names.add(local)
            elif isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                if any(self._task_decorator(item) for item in node.decorator_list):
                    self.task_names.add(node.name)
            elif isinstance(node, ast.Assign) and isinstance(node.value, ast.Call):
                called = self._called_name(node.value)
                targets = [target.id for target in node.targets if isinstance(target, ast.Name)]
                if called == "celery.Celery":
                    self.app_names.update(targets)
                elif called and called.rsplit(".", 1)[-1] in _RESULT_MAKERS:
                    self.result_names.update(targets)

    def _absolute(self, node: ast.ImportFrom) -> str:
        """The module a ``from ... import`` names, relative imports resolved."""
        if not node.level:
            return node.module or ""
        # A module "a.b.c" is in package "a.b"; a package's __init__ is registered as itself
        # by the doctor with a trailing ".__init__", so both drop one part per level.
        base = self.module.split(".")[:-node.level]
        return ".".join([*base, *([node.module] if node.module else [])])

    def _resolve(self, node: ast.AST) -> str | None:
        """The Celery name of an expression (``group``, ``celery.group``), if it is one."""
        parts = _dotted(node)
        if not parts or parts[0] not in self.aliases:
            return None
        return ".".join([self.aliases[parts[0]], *parts[1:]])

    def _called_name(self, call: ast.Call) -> str | None:
        resolved = self._resolve(call.func)
        if resolved:
            return resolved
        return call.func.attr if isinstance(call.func, ast.Attribute) else None

    def _task_decorator(self, node: ast.AST) -> ast.Call | bool:
        target = node.func if isinstance(node, ast.Call) else node
        parts = _dotted(target)
        if not parts or parts[-1] not in _TASK_DECORATORS:
            return False
        return node if isinstance(node, ast.Call) else True

    def _is_app(self, node: ast.AST) -> bool:
        if isinstance(node, ast.Name):
            return node.id in self.app_names or self._resolve(node) == "celery.current_app"
        # self.app inside a bound task
        return isinstance(node, ast.Attribute) and node.attr == "app" and \
            isinstance(node.value, ast.Name) and node.value.id in self.bound

    def add(self, pattern: str, node: ast.AST, detail: str) -> None:
        self.uses.append(ApiUse(pattern, getattr(node, "lineno", 0), detail))

    # --- names ------------------------------------------------------------------------------

    def _check_name(self, name: str, node: ast.AST) -> None:
        if name == "celery" or name.startswith("celery."):
            pattern = _missing_pattern(name)
            if pattern:
                self.add(pattern, node, name)
            elif not exists_in_facade(name):
                self.add("unavailable name", node, name.replace("celery", "akadze_compat", 1))

    def visit_Import(self, node: ast.Import) -> None:
        for alias in node.names:
            if alias.name == "celery" or alias.name.startswith("celery."):
                self.add("import celery", node, f"import {alias.name}")
            name = _celery_name(alias.name)
            if name:
                self._check_name(name, node)

    def visit_ImportFrom(self, node: ast.ImportFrom) -> None:
        module = _celery_name(node.module or "") if node.level == 0 else None
        if module is None:
            return
        if (node.module or "").split(".")[0] == "celery":
            self.add("import celery", node, f"from {node.module} import ...")
        for alias in node.names:
            self._check_name(module if alias.name == "*" else f"{module}.{alias.name}", node)

    def visit_Name(self, node: ast.Name) -> None:
        if isinstance(node.ctx, ast.Load) and node.id in self.aliases:
            pattern = _missing_pattern(self.aliases[node.id])
            if pattern:
                self.add(pattern, node, self.aliases[node.id])

    def visit_Attribute(self, node: ast.Attribute) -> None:
        resolved = self._resolve(node)
        if resolved and isinstance(node.ctx, ast.Load):
            self._check_name(resolved, node)
            return  # the inner parts of a Celery name are the same use
        value = node.value
        if isinstance(value, ast.Attribute) and value.attr == "control" and \
                node.attr not in _CONTROL_HAS:
            pattern = "app.control.inspect" if node.attr == "inspect" \
                else "app.control.rate_limit" if node.attr == "rate_limit" else "app.control.*"
            self.add(pattern, node, f"app.control.{node.attr}")
        elif isinstance(node.ctx, ast.Load) and self._is_app(value) and \
                node.attr not in self.app_attributes and not node.attr.startswith("_"):
            self.add("app.*", node, f"app.{node.attr}")
        elif isinstance(value, ast.Attribute) and value.attr == "request" and \
                isinstance(value.value, ast.Name) and value.value.id in self.bound:
            if node.attr == "delivery_info":
                self.add("request.delivery_info", node, "self.request.delivery_info")
            elif node.attr in ("chain", "chord", "group", "group_index"):
                self.add("request.chain / chord / group", node, f"self.request.{node.attr}")
        self.generic_visit(node)

    # --- calls and operators ------------------------------------------------------------------

    def _signature_like(self, node: ast.AST) -> bool:
        if not isinstance(node, ast.Call):
            return False
        called = self._called_name(node) or ""
        return called.rsplit(".", 1)[-1] in _SIGNATURE_CALLS or called in (
            "celery.signature", "celery.Signature", "celery.canvas.Signature")

    def visit_BinOp(self, node: ast.BinOp) -> None:
        if isinstance(node.op, ast.BitOr) and (self._signature_like(node.left)
                                               or self._signature_like(node.right)):
            self.add("signature | signature", node, "sig | sig")
        self.generic_visit(node)

    def visit_Call(self, node: ast.Call) -> None:
        func = node.func
        method = func.attr if isinstance(func, ast.Attribute) else None
        receiver = func.value if isinstance(func, ast.Attribute) else None
        receiver_name = receiver.id if isinstance(receiver, ast.Name) else None
        called = (self._called_name(node) or "").rsplit(".", 1)[-1]
        keywords = {keyword.arg: keyword.value for keyword in node.keywords if keyword.arg}
        if method and receiver_name not in self.other_modules:
            self._method_call(node, method, receiver, receiver_name, keywords)
        if called in _OPTION_CALLS:
            self._options(node, keywords)
        self.generic_visit(node)

    def _method_call(self, node: ast.Call, method: str, receiver: Any,
                     receiver_name: str | None, keywords: dict[str, ast.expr]) -> None:
        on_result = receiver_name in self.result_names or (
            isinstance(receiver, ast.Call)
            and (self._called_name(receiver) or "").rsplit(".", 1)[-1] in _RESULT_MAKERS)
        if method in _RESULT_GRAPH and on_result:
            self.add("AsyncResult.then / collect / build_graph", node, f"result.{method}()")
        elif method == "forget" and on_result:
            self.add("AsyncResult.forget", node, "result.forget()")
        elif method == "revoke" and _is_true(keywords.get("terminate")):
            self.add("revoke(terminate=True)", node, "revoke(terminate=True)")
        elif method in ("link", "link_error", "on_error") and (
                self._signature_like(receiver) or receiver_name is not None):
            self.add("link / link_error", node, f".{method}()")
        elif method in ("map", "starmap", "chunks") and receiver_name in self.task_names:
            self.add("Task.map / Task.starmap / Task.chunks", node, f"{receiver_name}.{method}")
        elif receiver_name in self.bound and method in _BOUND_TASK_ONLY:
            self.add(_BOUND_TASK_ONLY[method], node, f"self.{method}()")
        elif receiver_name in self.bound and method == "update_state" and \
                (node.args or "task_id" in keywords):
            self.add("update_state(task_id=...)", node, "self.update_state(task_id=...)")

    def _options(self, node: ast.Call, keywords: dict[str, ast.expr]) -> None:
        for name in ("link", "link_error"):
            if name in keywords:
                self.add("link / link_error", node, f"{name}=")
        serializer = keywords.get("serializer")
        if isinstance(serializer, ast.Constant) and isinstance(serializer.value, str):
            try:
                check_serializer(serializer.value, "serializer")
            except ImproperlyConfigured:
                self.add("serializer=", node, f"serializer={serializer.value!r}")
        if "priority" in keywords:
            self.add("priority=", node, "priority=")

    # --- scopes: bound tasks and Task classes ----------------------------------------------------

    def _visit_function(self, node: ast.FunctionDef | ast.AsyncFunctionDef) -> None:
        bound = None
        for decorator in node.decorator_list:
            call = self._task_decorator(decorator)
            if isinstance(call, ast.Call) and any(
                    keyword.arg == "bind" and _is_true(keyword.value)
                    for keyword in call.keywords):
                bound = node.args.args[0].arg if node.args.args else None
        self.bound.append(bound or "")
        self.generic_visit(node)
        self.bound.pop()

    visit_FunctionDef = _visit_function
    visit_AsyncFunctionDef = _visit_function

    def visit_ClassDef(self, node: ast.ClassDef) -> None:
        is_task = any(self._resolve(base) == "celery.Task" or (
            isinstance(base, ast.Attribute) and base.attr == "Task") for base in node.bases)
        if not is_task:
            self.generic_visit(node)
            return
        for item in node.body:
            if isinstance(item, (ast.FunctionDef, ast.AsyncFunctionDef)) and item.args.args:
                self.bound.append(item.args.args[0].arg)
                self.generic_visit(item)
                self.bound.pop()
            else:
                self.visit(item)
        for expr in [*node.bases, *node.decorator_list]:
            self.visit(expr)


def _default_app_attributes() -> frozenset[str]:
    return frozenset(dir(Celery)) | frozenset({
        "main", "task_cls", "set_as_current", "autofinalize", "namespace", "strict_typing",
        "configured", "finalized", "on_configure", "on_after_configure", "on_after_finalize",
        "on_after_fork", "loader", "control"})


def scan_source(source: str, filename: str = "<string>", *, module: str = "__main__",
                task_names: Iterable[str] = (), app_refs: Iterable[tuple[str, str]] = (),
                app_attributes: Iterable[str] | None = None) -> list[ApiUse]:
    """The uses of ``API_PATTERNS`` in one module's source, in line order (one per pattern
    and line). Raises SyntaxError for a file that does not parse.

    ``module`` is the module's dotted name (``pkg.__init__`` for a package's ``__init__``),
    to resolve relative imports. The project's facts sharpen the scan: ``task_names``, its
    task functions' names (for ``add.chunks(...)``); ``app_refs``, the ``(module,
    attribute)`` pairs that hold its Celery app (for ``app.amqp``); ``app_attributes``,
    what that app has (default: what a ``Celery`` has).
    """
    tree = ast.parse(source, filename)
    attributes = frozenset(app_attributes) if app_attributes is not None \
        else _default_app_attributes()
    scanner = _Scanner(tree, module, frozenset(task_names), frozenset(app_refs), attributes)
    scanner.visit(tree)
    seen: dict[tuple[str, int], ApiUse] = {}
    for use in scanner.uses:
        seen.setdefault((use.pattern, use.line), use)
    return sorted(seen.values(), key=lambda use: (use.line, use.pattern))
