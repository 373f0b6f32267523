"""akadze's web dashboard: an ASGI app (``create_app``) served by ``akadze dashboard`` and
``akadze-compat flower``, or mounted in a Starlette, FastAPI or Django project.

Needs the ``dashboard`` extra (``pip install 'akadze[dashboard]'``: Starlette, Jinja2 and
uvicorn); importing this package without it raises ``ImportError`` naming the extra.
"""

from __future__ import annotations

try:
    from .web import Dashboard, DashboardConfig, create_app
except ImportError as exc:  # pragma: no cover - exercised where the extra is missing
    raise ImportError(f"the akadze dashboard needs the 'dashboard' extra: pip install "
                      f"'akadze[dashboard]' ({exc})") from exc

__all__ = ["Dashboard", "DashboardConfig", "create_app"]
