"""Fixtures of the add-on tests: a database of their own per module."""

from __future__ import annotations

from tests.compat.conftest import module_database_url

__all__ = ["module_database_url"]
