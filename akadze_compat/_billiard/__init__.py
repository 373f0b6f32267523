"""What ``import billiard`` gives while the celery alias is on (``akadze_compat.as_celery``).

Celery's add-ons reach into billiard, Celery's process pool, for a few names: its version,
``billiard.einfo.ExceptionInfo`` (what ``task_failure`` hands over as ``einfo``), the time-limit
exceptions of ``billiard.exceptions`` and ``billiard.process.current_process``. akadze's worker
is not billiard, so these are akadze's own objects under billiard's names: catching
``billiard.exceptions.SoftTimeLimitExceeded`` catches what akadze raises. The rest of billiard
(its Pool, its multiprocessing clone) is not provided.
"""

from __future__ import annotations

from .process import current_process

__all__ = ["VERSION", "__version__", "current_process"]

#: The billiard release Celery 5.7 runs on, whose names this module follows.
__version__ = "4.3.2"
VERSION = (4, 3, 2, "")
