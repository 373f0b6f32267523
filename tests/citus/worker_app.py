"""tests.workers.worker_app in Citus mode: ``python -m tests.citus.worker_app [options]``."""

from __future__ import annotations

from akadze_core.store.queries import use_dialect
from tests.workers import worker_app

if __name__ == "__main__":
    use_dialect("citus")
    worker_app.main()
