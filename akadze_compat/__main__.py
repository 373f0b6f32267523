"""``python -m akadze_compat``: the ``akadze-compat`` command (prefork children run this)."""

from .bin.celery import main

if __name__ == "__main__":
    main()
