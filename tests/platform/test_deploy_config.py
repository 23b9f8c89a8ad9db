"""Finding 5 of the security audit: the shipped deployment is the production configuration.

The compose file is validated as data (there is no Docker daemon here), and the
production settings are loaded in fresh processes, with and without their secrets.
"""

from __future__ import annotations

import os
import re
import secrets
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

REPO_ROOT = Path(__file__).resolve().parents[2]
COMPOSE = yaml.safe_load((REPO_ROOT / "docker-compose.yml").read_text())
SERVICES = COMPOSE["services"]
TANDEM_SERVICES = ("web", "platform-worker", "worker", "trainer")


def _manage(*args: str, **env: str) -> subprocess.CompletedProcess:
    base = {key: value for key, value in os.environ.items()
            if key not in ("DJANGO_SECRET_KEY", "ALLOWED_HOSTS", "DJANGO_SETTINGS_MODULE")}
    return subprocess.run([sys.executable, "manage.py", *args], cwd=REPO_ROOT / "platform",
                          env={**base, **env}, capture_output=True, text=True, timeout=120)


def test_production_settings_pass_djangos_deployment_checks():
    result = _manage("check", "--deploy", "--fail-level", "WARNING",
                     DJANGO_SETTINGS_MODULE="config.settings.prod",
                     DJANGO_SECRET_KEY=secrets.token_urlsafe(48), ALLOWED_HOSTS="tandem.example.com")
    assert result.returncode == 0, result.stderr


@pytest.mark.parametrize(("env", "named"), [
    ({"ALLOWED_HOSTS": "tandem.example.com"}, "DJANGO_SECRET_KEY"),
    ({"ALLOWED_HOSTS": "tandem.example.com", "DJANGO_SECRET_KEY": "insecure-dev-key-change-me-tandem"},
     "DJANGO_SECRET_KEY"),
    ({"DJANGO_SECRET_KEY": "x" * 48}, "ALLOWED_HOSTS"),
    ({"DJANGO_SECRET_KEY": "x" * 48, "ALLOWED_HOSTS": "*"}, "ALLOWED_HOSTS"),
])
def test_production_settings_refuse_to_start_without_their_secret_and_host_names(env, named):
    result = _manage("check", DJANGO_SETTINGS_MODULE="config.settings.prod", **env)
    assert result.returncode != 0
    assert "ImproperlyConfigured" in result.stderr and named in result.stderr


def test_dev_settings_answer_loopback_host_names_only():
    code = "from django.conf import settings; print(settings.ALLOWED_HOSTS)"
    result = _manage("shell", "-c", code, DJANGO_SETTINGS_MODULE="config.settings.dev")
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip().splitlines()[-1] == "['127.0.0.1', 'localhost', '[::1]']"


def test_compose_runs_production_settings_with_secrets_from_the_environment():
    for name in ("web", "platform-worker"):
        environment = SERVICES[name]["environment"]
        assert environment["DJANGO_SETTINGS_MODULE"] == "config.settings.prod"
        for key in ("DJANGO_SECRET_KEY", "ALLOWED_HOSTS"):
            assert environment[key].startswith(f"${{{key}:?"), (name, key)
        assert "${POSTGRES_PASSWORD:?" in environment["DATABASE_URL"]
    assert SERVICES["postgres"]["environment"]["POSTGRES_PASSWORD"].startswith("${POSTGRES_PASSWORD:?")
    redis_command = " ".join(SERVICES["redis"]["command"])
    assert "--appendonly yes" in redis_command and "--maxmemory-policy noeviction" in redis_command


# The Redis user each Tandem service connects as, and the variable holding its password.
REDIS_ROLES = {
    "web": ("tandem-platform", "REDIS_PLATFORM_PASSWORD"),
    "platform-worker": ("tandem-platform", "REDIS_PLATFORM_PASSWORD"),
    "worker": ("tandem-worker", "REDIS_WORKER_PASSWORD"),
    "probe-worker": ("tandem-worker", "REDIS_WORKER_PASSWORD"),
    "trainer": ("tandem-trainer", "REDIS_TRAINER_PASSWORD"),
}


def test_compose_connects_each_role_to_redis_as_its_own_user_with_its_own_password():
    for name, (user, variable) in REDIS_ROLES.items():
        url = re.fullmatch(r"redis://(?P<user>[\w-]+):(?P<password>\$\{\w+:\?[^}]*\})@redis:6379/0",
                           SERVICES[name]["environment"]["REDIS_URL"])
        assert url is not None, name
        assert url["user"] == user, name
        assert url["password"].startswith(f"${{{variable}:?"), name
        # The admin's password (REDIS_PASSWORD) is the operator's, never a service's.
        assert "REDIS_PASSWORD:" not in SERVICES[name]["environment"]["REDIS_URL"], name
    assert len({user for user, _ in REDIS_ROLES.values()}) == 3
    redis = SERVICES["redis"]
    for _, variable in REDIS_ROLES.values():
        assert redis["environment"][variable].startswith(f"${{{variable}:?"), variable
    assert redis["environment"]["REDIS_PASSWORD"].startswith("${REDIS_PASSWORD:?")


def test_compose_keeps_redis_passwords_off_the_servers_command_line():
    redis = SERVICES["redis"]
    argv = " ".join(redis["entrypoint"] + redis["command"])
    assert "${" not in argv and "requirepass" not in argv and "PASSWORD" not in argv
    assert redis["entrypoint"] == ["sh", "/tandem-redis/entrypoint.sh"]
    assert "./deploy/redis:/tandem-redis:ro" in redis["volumes"]
    assert "/run/tandem-redis" in redis["tmpfs"]
    entrypoint = (REPO_ROOT / "deploy/redis/entrypoint.sh").read_text()
    assert "--aclfile /run/tandem-redis/users.acl" in entrypoint.replace('"$acl_file"', "/run/tandem-redis/users.acl")
    # The health check signs in as admin with the password in the environment, not in argv.
    assert 'REDISCLI_AUTH="$$REDIS_PASSWORD" redis-cli --user admin ping' in redis["healthcheck"]["test"][1]


def _write_acl(tmp_path: Path, **passwords: str) -> subprocess.CompletedProcess:
    env = {"PATH": os.environ["PATH"], **passwords}
    return subprocess.run(["sh", str(REPO_ROOT / "deploy/redis/write-acl.sh"), str(tmp_path / "users.acl")],
                          env=env, capture_output=True, text=True, timeout=30)


ROLE_PASSWORDS = {variable: secrets.token_hex(24) for variable in
                  ("REDIS_PASSWORD", "REDIS_PLATFORM_PASSWORD", "REDIS_WORKER_PASSWORD", "REDIS_TRAINER_PASSWORD")}


def test_the_acl_file_turns_the_default_user_off_and_denies_dangerous_commands_to_every_role(tmp_path):
    result = _write_acl(tmp_path, **ROLE_PASSWORDS)
    assert result.returncode == 0, result.stderr
    text = (tmp_path / "users.acl").read_text()
    assert (tmp_path / "users.acl").stat().st_mode & 0o077 == 0
    users = {line.split()[1]: line.split()[2:] for line in text.splitlines()}
    assert set(users) == {"default", "admin", "tandem-platform", "tandem-worker", "tandem-trainer"}
    assert users["default"][0] == "off"
    for user in ("tandem-platform", "tandem-worker", "tandem-trainer"):
        rules = users[user]
        assert rules[0] == "on" and "-@dangerous" in rules, user
        assert "allkeys" not in rules and "~*" not in rules, user
    # The platform's cache and Channels layer are its own.
    for user in ("tandem-worker", "tandem-trainer"):
        assert "~tandem:*" not in users[user], user
    # Hashes only: no password is in the file.
    for password in ROLE_PASSWORDS.values():
        assert password not in text


@pytest.mark.parametrize("short", ["REDIS_PASSWORD", "REDIS_WORKER_PASSWORD"])
def test_the_acl_file_is_not_written_with_a_missing_or_short_password(tmp_path, short):
    result = _write_acl(tmp_path, **{**ROLE_PASSWORDS, short: "short"})
    assert result.returncode != 0 and short in result.stderr
    missing = {key: value for key, value in ROLE_PASSWORDS.items() if key != short}
    result = _write_acl(tmp_path, **missing)
    assert result.returncode != 0 and short in result.stderr
    assert not (tmp_path / "users.acl").exists()


def test_compose_gives_the_secrets_key_to_every_process_that_opens_secrets_and_never_to_the_trainer():
    for name in ("web", "platform-worker", "platform-webhooks", "platform-datasets", "worker", "probe-worker"):
        assert SERVICES[name]["environment"]["TANDEM_SECRETS_KEY"].startswith("${TANDEM_SECRETS_KEY:?"), name
    assert "TANDEM_SECRETS_KEY" not in SERVICES["trainer"]["environment"]


def test_compose_runs_the_platform_queues_on_workers_of_their_own():
    for queue in ("platform-webhooks", "platform-datasets"):
        command = SERVICES[queue]["command"]
        assert f"--queues {queue}" in command, command
        assert SERVICES[queue]["environment"]["REDIS_URL"] == SERVICES["platform-worker"]["environment"]["REDIS_URL"]
    # Beat runs in exactly one process: the platform queue's worker.
    assert all("--beat" not in SERVICES[queue]["command"] for queue in ("platform-webhooks", "platform-datasets"))


def test_compose_runs_probes_on_a_worker_of_their_own_beside_the_rollout_workers():
    assert "--queues probes" in SERVICES["probe-worker"]["command"]
    assert "--queues" not in SERVICES["worker"]["command"]  # the default queues: probes too, when idle
    assert not {"DATABASE_URL", "DJANGO_SECRET_KEY"} & set(SERVICES["probe-worker"]["environment"])


def test_compose_gives_workers_no_database_and_the_trainer_its_token_in_the_environment():
    worker = SERVICES["worker"]["environment"]
    assert not {"DATABASE_URL", "DJANGO_SECRET_KEY"} & set(worker)
    trainer = SERVICES["trainer"]
    assert "token" not in trainer["command"].lower()
    assert trainer["environment"]["TANDEM_TRAINER_TOKEN"].startswith("${TANDEM_TRAINER_TOKEN:?")
    assert "DATABASE_URL" not in trainer["environment"]


def test_compose_keeps_state_in_named_volumes_mounted_wherever_it_is_used():
    declared = set(COMPOSE["volumes"])

    def mounts(service: str) -> dict[str, str]:
        return {volume.split(":")[0]: volume.split(":")[1] for volume in SERVICES[service].get("volumes", [])}

    assert mounts("redis")["redis-data"] == "/data"
    assert mounts("postgres")["postgres-data"] == "/var/lib/postgresql/data"
    # The trainer writes checkpoints; the web server exports, serves and deletes them.
    for service in ("web", "platform-worker", "trainer"):
        assert mounts(service)["checkpoints"] == "/app/var/checkpoints", service
    assert mounts("web")["media"] == "/app/var/media"
    for service in SERVICES:
        # Bind mounts of the checkout (./deploy/...) hold scripts, never state.
        assert {source for source in mounts(service) if not source.startswith("./")} <= declared, service


def test_compose_restarts_services_and_waits_for_healthy_dependencies():
    for name, service in SERVICES.items():
        assert service.get("restart") == "unless-stopped", name
    for name in ("redis", "postgres", "web"):
        assert SERVICES[name]["healthcheck"]["test"], name
    for name in TANDEM_SERVICES:
        conditions = {dependency["condition"] for dependency in SERVICES[name]["depends_on"].values()}
        assert conditions == {"service_healthy"}, name
    assert SERVICES["web"]["ports"] == ["127.0.0.1:8000:8000"]


def test_the_image_runs_as_an_unprivileged_user():
    lines = (REPO_ROOT / "Dockerfile").read_text().splitlines()
    users = [line.split()[1] for line in lines if line.startswith("USER ")]
    assert users and users[-1] not in ("root", "0")
