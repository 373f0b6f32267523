"""Celery-compatible facade over akadze_core (see the Celery facade issue)."""
