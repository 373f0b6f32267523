"""The task modules the benchmark's workers load (``bench.apps.core_app:app`` and
``bench.apps.celery_app``)."""
