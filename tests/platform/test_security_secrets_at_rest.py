"""Issue 28, finding 18 (first half): environment secret settings are ciphertext in the database and in Redis.

Before, ``EnvironmentVersionSecrets.values`` and the ``tandem:secrets:`` Redis keys held the
values in plain JSON: a database dump, a backup or any Redis reader had every team's API keys.
Now both hold Fernet tokens under ``TANDEM_SECRETS_KEY`` (tandem/runtime/secrets_at_rest.py); rollout
workers decrypt the Redis copies (tests/workers/test_security_secret_settings.py), and
``manage.py tandem_rotate_secrets_key`` re-encrypts everything under the first key.
Real PostgreSQL and Redis, read raw (SQL, GET/HGETALL).
"""

from __future__ import annotations

import os
import subprocess
import sys
from io import StringIO
from pathlib import Path

import pytest
from cryptography.fernet import Fernet
from django.core.management import CommandError, call_command
from django.db import connection
from django.db.migrations.executor import MigrationExecutor

from environment_registry.models import EnvironmentVersionSecrets
from environment_registry.selectors import environment_version_secret_settings
from runs.services import run_claim_next, run_create
from tandem.contracts import (
    EnvironmentSecrets,
    probe_environment_secrets_key,
    probe_request_key,
    run_environment_secrets_key,
)
from tandem.runtime.secrets_at_rest import (
    SecretsCipher,
    SecretsKeyError,
    environment_secrets_open,
    environment_secrets_seal,
)
from tests.workers.secret_environments import API_KEY

REPO_ROOT = Path(__file__).resolve().parents[2]
KEYED = {"name": "keyed", "kind": "python", "entrypoint": "tests.workers.secret_environments:KeyedEnvironment",
         "settings": {"greeting": "hi"}}


def _rows() -> list[tuple]:
    with connection.cursor() as cursor:
        cursor.execute(f"SELECT * FROM {EnvironmentVersionSecrets._meta.db_table}")
        return cursor.fetchall()


def test_the_database_holds_no_secret_setting_in_plain_text(api, project):
    registered = api.post("/api/environments/", {**KEYED, "project": project.pk,
                                                 "secret_settings": {"api_key": API_KEY}}, format="json")
    assert registered.status_code == 201, registered.json()

    rows = _rows()
    assert len(rows) == 1
    assert not any(API_KEY in str(value) for value in rows[0]), "the secret setting is stored in plain text"
    version_id = registered.json()["versions"][0]["id"]
    secrets = EnvironmentVersionSecrets.objects.get(version_id=version_id)
    assert environment_version_secret_settings(version=secrets.version) == {"api_key": API_KEY}


def test_redis_holds_no_secret_setting_in_plain_text(api, project, keyed_version, redis_client,
                                                     django_capture_on_commit_callbacks, settings):
    run = run_create(user=project.owner, project=project, environment_name="keyed", config={"sft_steps": 0})
    with django_capture_on_commit_callbacks(execute=True):
        run_claim_next(worker="gpu-box:1")
        probed = api.post(f"/api/environments/{keyed_version.environment_id}/versions/1/probe/")
    assert probed.status_code in (201, 202), probed.content
    probe = keyed_version.probes.order_by("-pk").first()

    stored = {"run": redis_client.get(run_environment_secrets_key(run.pk)),
              "probe": redis_client.get(probe_environment_secrets_key(probe.pk))}
    try:
        for what, raw in stored.items():
            assert raw is not None, what
            assert API_KEY.encode() not in raw, f"the {what}'s secret settings are in Redis in plain text"
            record = environment_secrets_open(raw, SecretsCipher(settings.TANDEM_SECRETS_KEYS))
            assert record.revealed() == {"api_key": API_KEY} and record.version_id == keyed_version.pk
    finally:
        redis_client.delete(run_environment_secrets_key(run.pk), probe_environment_secrets_key(probe.pk),
                            probe_request_key(probe.pk))


def test_rotation_re_encrypts_under_the_first_key_and_old_tokens_still_decrypt_before_it(
    keyed_version, redis_client, settings, run_id
):
    old_key, new_key = settings.TANDEM_SECRETS_KEYS[0], Fernet.generate_key().decode()
    under_old_key = EnvironmentVersionSecrets.objects.get(version=keyed_version).ciphertext
    redis_key = probe_environment_secrets_key(run_id)
    redis_client.set(redis_key, environment_secrets_seal(
        EnvironmentSecrets(version_id=keyed_version.pk, settings={"api_key": API_KEY}), SecretsCipher([old_key])),
        ex=600)
    settings.TANDEM_SECRETS_KEYS = [new_key, old_key]
    # Before the rotation, the new key list (MultiFernet) reads what the old key wrote.
    assert environment_version_secret_settings(version=keyed_version) == {"api_key": API_KEY}

    output = StringIO()
    try:
        call_command("tandem_rotate_secrets_key", stdout=output)

        rotated = EnvironmentVersionSecrets.objects.get(version=keyed_version).ciphertext
        assert rotated != under_old_key and API_KEY not in rotated
        assert SecretsCipher([new_key]).decrypt(rotated) == SecretsCipher([old_key]).decrypt(under_old_key)
        with pytest.raises(SecretsKeyError):
            SecretsCipher([old_key]).decrypt(rotated)
        record = environment_secrets_open(redis_client.get(redis_key), SecretsCipher([new_key]))
        assert record.revealed() == {"api_key": API_KEY}
        assert 0 < redis_client.ttl(redis_key) <= 600  # the Redis copy keeps its expiry
        assert "1 stored version(s)" in output.getvalue() and "1 Redis value(s)" in output.getvalue()
        settings.TANDEM_SECRETS_KEYS = [new_key]  # the old key dropped: everything still reads
        assert environment_version_secret_settings(version=keyed_version) == {"api_key": API_KEY}
    finally:
        redis_client.delete(redis_key)


def test_rotation_refuses_values_no_key_decrypts_and_names_them(keyed_version, settings):
    settings.TANDEM_SECRETS_KEYS = [Fernet.generate_key().decode()]  # the platform's key lost

    with pytest.raises(CommandError, match="none of the 1 key.*nothing was changed"):
        call_command("tandem_rotate_secrets_key", stdout=StringIO())


@pytest.mark.django_db(transaction=True)
def test_the_migration_encrypts_the_secret_settings_stored_before_it(settings):
    executor = MigrationExecutor(connection)
    executor.migrate([("environments", "0006_episode_limits")])
    old_apps = executor.loader.project_state([("environments", "0006_episode_limits")]).apps
    try:
        environment = old_apps.get_model("environments", "Environment")
        version = old_apps.get_model("environments", "EnvironmentVersion")
        project = old_apps.get_model("accounts", "Project")
        user = old_apps.get_model("auth", "User").objects.create(username="migrated")
        owned = project.objects.create(name="migrated", owner_id=user.pk)
        registered = environment.objects.create(project=owned, name="keyed")
        stored = version.objects.create(environment=registered, number=1, kind="python",
                                        entrypoint=KEYED["entrypoint"], secret_setting_names=["api_key"])
        old_apps.get_model("environments", "EnvironmentVersionSecrets").objects.create(
            version=stored, values={"api_key": API_KEY})

        executor = MigrationExecutor(connection)
        executor.loader.build_graph()
        executor.migrate(executor.loader.graph.leaf_nodes())

        rows = _rows()
        assert len(rows) == 1 and not any(API_KEY in str(value) for value in rows[0])
        migrated = EnvironmentVersionSecrets.objects.get(version_id=stored.pk)
        assert environment_version_secret_settings(version=migrated.version) == {"api_key": API_KEY}
    finally:
        executor = MigrationExecutor(connection)
        executor.migrate(executor.loader.graph.leaf_nodes())


def _settings_check(module: str, **env: str) -> subprocess.CompletedProcess:
    base = {key: value for key, value in os.environ.items()
            if key not in ("TANDEM_SECRETS_KEY", "TANDEM_SECRETS_KEY_FILE", "DJANGO_SETTINGS_MODULE")}
    code = "from django.conf import settings; print(len(settings.TANDEM_SECRETS_KEYS))"
    return subprocess.run([sys.executable, "manage.py", "shell", "-c", code], cwd=REPO_ROOT / "platform",
                          env={**base, "DJANGO_SETTINGS_MODULE": module, "DJANGO_SECRET_KEY": "x" * 48,
                               "ALLOWED_HOSTS": "tandem.example.com", **env},
                          capture_output=True, text=True, timeout=120)


def test_production_settings_refuse_to_start_without_a_secrets_key():
    result = _settings_check("config.settings.prod")

    assert result.returncode != 0
    assert "ImproperlyConfigured" in result.stderr and "TANDEM_SECRETS_KEY" in result.stderr


def test_production_settings_refuse_a_key_that_is_not_a_fernet_key():
    result = _settings_check("config.settings.prod", TANDEM_SECRETS_KEY=f"{Fernet.generate_key().decode()},short")

    assert result.returncode != 0
    assert "ImproperlyConfigured" in result.stderr and "key 2 of 2 is not a Fernet key" in result.stderr


def test_production_settings_take_keys_from_the_environment_or_a_file(tmp_path):
    keys = [Fernet.generate_key().decode() for _ in range(2)]
    key_file = tmp_path / "secrets.key"
    key_file.write_text(",".join(keys) + "\n")

    from_variable = _settings_check("config.settings.prod", TANDEM_SECRETS_KEY=",".join(keys))
    from_file = _settings_check("config.settings.prod", TANDEM_SECRETS_KEY_FILE=str(key_file))

    assert from_variable.returncode == 0, from_variable.stderr
    assert from_variable.stdout.strip().splitlines()[-1] == "2"
    assert from_file.returncode == 0, from_file.stderr
    assert from_file.stdout.strip().splitlines()[-1] == "2"


def test_dev_settings_generate_a_key_file_on_first_start_and_keep_it(tmp_path):
    key_file = tmp_path / "var" / "secrets.key"

    first = _settings_check("config.settings.dev", TANDEM_SECRETS_KEY_FILE=str(key_file))
    key = key_file.read_text()
    second = _settings_check("config.settings.dev", TANDEM_SECRETS_KEY_FILE=str(key_file))

    assert first.returncode == 0 and second.returncode == 0, (first.stderr, second.stderr)
    assert first.stdout.strip().splitlines()[-1] == "1"
    assert key_file.read_text() == key and oct(key_file.stat().st_mode & 0o777) == "0o600"
    SecretsCipher([key.strip()])  # a Fernet key
