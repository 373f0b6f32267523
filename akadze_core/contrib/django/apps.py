"""The Django app of the integration (``INSTALLED_APPS += ["akadze_core.contrib.django"]``):
it adds the ``manage.py akadze`` command and nothing else (no models)."""

from __future__ import annotations

from django.apps import AppConfig


class AkadzeConfig(AppConfig):
    """Labelled ``akadze``: the package's last name, ``django``, would read as Django's."""

    name = "akadze_core.contrib.django"
    label = "akadze"
    verbose_name = "akadze"
