"""A Django app whose tasks django_celery_beat's periodic tasks name."""
