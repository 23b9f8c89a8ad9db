"""The model field a run's config is stored in."""

from __future__ import annotations

from django.db import models

from tandem.configs.run import upgrade_run_config


class RunConfigField(models.JSONField):
    """A JSON column of RunConfigs that reads every stored config in the current shape.

    Rows keep the shape they were written in (no data migration); each config
    read from the database goes through ``upgrade_run_config``, so every reader
    (the trainer's claim, a clone, the pages, the API, a checkpoint export)
    sees one shape, whenever the run was stored.
    """

    def from_db_value(self, value, expression, connection):
        config = super().from_db_value(value, expression, connection)
        return upgrade_run_config(config) if isinstance(config, dict) else config

    def deconstruct(self):
        # The column is a plain JSONField: only how Python reads it differs. Migrations
        # (and the data migrations among them) see it as one, and need no change.
        name, _, args, kwargs = super().deconstruct()
        return name, "django.db.models.JSONField", args, kwargs
