"""Extras that sit beside the facade, as in Celery's ``celery.contrib``.

``akadze_compat.contrib.pytest`` is the pytest plugin (Celery's fixtures), and
``akadze_compat.contrib.testing`` the embedded test worker and test app behind it.
"""
