"""The akadze benchmark: ``python -m bench`` runs every workload and prints a table.

Nothing here is imported by ``akadze_core`` or ``akadze_compat``. Real Celery runs only in a
separate virtualenv (``bench/celery_real`` is executed there, never imported here).
"""
