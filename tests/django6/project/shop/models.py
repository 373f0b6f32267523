from django.db import models


class Order(models.Model):
    email = models.CharField(max_length=200)


class Run(models.Model):
    """One row per run of ``tasks.record``, written by the worker through the ORM."""

    label = models.CharField(max_length=50)
