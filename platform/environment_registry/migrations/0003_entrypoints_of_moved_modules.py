"""Stored entrypoints follow the environment code to its own top-level package.

The built-in environments and adapters moved from ``workers.environments`` to
``environments`` (``environments.builtin.*`` and ``environments.adapters.*``);
versions registered before the move name the old modules, which no longer exist.
"""

from django.db import migrations

MOVED_MODULES = {
    "workers.environments.calculator": "environments.builtin.calculator",
    "workers.environments.guessing_game": "environments.builtin.guessing_game",
    "workers.environments.http": "environments.adapters.http",
    "workers.environments.openenv": "environments.adapters.openenv",
    "workers.environments.gymnasium_text": "environments.adapters.gymnasium_text",
    "workers.environments.reasoning_gym": "environments.adapters.reasoning_gym",
}


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
