"""Testing helpers, as in Celery's ``celery.contrib.testing``: ``app`` (the test app and the
app trap), ``worker`` (``start_worker``, a real worker in a thread of the test process) and
``tasks`` (the ``celery.ping`` task the worker's start-up check runs)."""
