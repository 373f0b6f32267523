"""``celery.contrib.django``: Django helpers (``task.DjangoTask``)."""
