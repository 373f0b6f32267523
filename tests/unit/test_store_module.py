"""The store rule: in akadze_core only ``store/database.py`` executes SQL
(``store/migrations.py`` applies the schema's DDL, the one exception), so every statement has
one place to be found."""

from __future__ import annotations

import ast
from pathlib import Path

CORE = Path(__file__).resolve().parents[2] / "akadze_core"
ALLOWED = {"store/database.py", "store/migrations.py"}


def _executing_modules() -> set[str]:
    found = set()
    for path in CORE.rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text("utf-8"))):
            if (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute)
                    and node.func.attr in {"execute", "executemany"}
                    # The process pool's execute runs a job body, not SQL.
                    and not ast.unparse(node.func.value).endswith("process_pool")):
                found.add(path.relative_to(CORE).as_posix())
    return found


def test_only_the_store_module_executes_sql() -> None:
    assert _executing_modules() - ALLOWED == set()
    assert "store/database.py" in _executing_modules()
