"""Operating a running queue through an App: control of jobs and workers (cancel, requeue,
``broadcast``) and the Prometheus metrics read from the database."""
