"""Stored entrypoints follow the environment code to its own top-level package.

The built-in environments and adapters moved from ``workers.environments`` to
``environments`` (``environments.builtin.*`` and ``environments.adapters.*``);
versions registered before the move name the old modules, which no longer exist.
"""

from django.db import migrations

from tandem.contracts.environments import MOVED_ENVIRONMENT_MODULES

# The map is the contract's, the one readers of old Redis records use too; it is history, fixed.
MOVED_MODULES = MOVED_ENVIRONMENT_MODULES


def _rewrite(apps, moves: dict[str, str]) -> None:
    EnvironmentVersion = apps.get_model("environments", "EnvironmentVersion")
    for old, new in moves.items():
        for version in EnvironmentVersion.objects.filter(entrypoint__startswith=f"{old}:"):
            version.entrypoint = new + version.entrypoint[len(old):]
            version.save(update_fields=["entrypoint"])


def forwards(apps, schema_editor):
    _rewrite(apps, MOVED_MODULES)


def backwards(apps, schema_editor):
    _rewrite(apps, {new: old for old, new in MOVED_MODULES.items()})


class Migration(migrations.Migration):
    dependencies = [("environments", "0002_environment_versions_and_probes")]

    operations = [migrations.RunPython(forwards, backwards)]
