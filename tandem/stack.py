"""Starting and stopping a whole Tandem on one machine: web, platform worker, producers, trainer.

``tandem up`` and the end-to-end tests both use it, so the tests exercise
the same processes, commands and settings a user gets.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

import httpx

REPO_ROOT = Path(__file__).resolve().parents[1]
PLATFORM_DIR = REPO_ROOT / "platform"


#: The password of ``tandem up --demo``'s user: well known, so only ever on loopback.
DEMO_PASSWORD = "demo"
LOOPBACK_HOSTS = frozenset({"127.0.0.1", "::1", "localhost"})


class StackError(RuntimeError):
    pass


@dataclass
class StackConfig:
    redis_url: str
    database_url: str | None = None  # None: the platform's embedded SQLite
    host: str = "127.0.0.1"
    port: int = 8000
    workers: int = 2
    worker_concurrency: int = 4  # rollout tasks each worker runs at once
    var_dir: Path = REPO_ROOT / "var"
    django_settings: str = "config.settings.dev"
    extra_env: dict[str, str] = field(default_factory=dict)

    @property
    def platform_url(self) -> str:
        return f"http://{self.host}:{self.port}"


@dataclass(frozen=True)
class Credentials:
    username: str
    # The login's password when this bootstrap created the user; None when it already existed.
    password: str | None
    user_token: str
    trainer_token: str
    project_id: int


class LocalStack:
    def __init__(self, config: StackConfig):
        self.config = config
        self.log_dir = config.var_dir / "logs"
        self.log_dir.mkdir(parents=True, exist_ok=True)
        self.processes: dict[str, subprocess.Popen] = {}

    def env(self) -> dict[str, str]:
        env = {**os.environ, **self.config.extra_env}
        env["REDIS_URL"] = self.config.redis_url
        env["DJANGO_SETTINGS_MODULE"] = self.config.django_settings
        env["PYTHONPATH"] = os.pathsep.join([str(REPO_ROOT), str(PLATFORM_DIR), env.get("PYTHONPATH", "")])
        env["PYTHONUNBUFFERED"] = "1"
        env.setdefault("TANDEM_MEDIA_ROOT", str(self.config.var_dir / "media"))
        # Where the trainer writes checkpoints (start_trainer) is where the web process accepts
        # and deletes them (checkpoints.selectors.checkpoint_path_in_root).
        env["TANDEM_CHECKPOINT_ROOT"] = str(self.config.var_dir / "checkpoints")
        if self.config.database_url:
            env["DATABASE_URL"] = self.config.database_url
        return env

    def manage(self, *args: str, env: dict[str, str] | None = None) -> str:
        result = subprocess.run(
            [sys.executable, str(PLATFORM_DIR / "manage.py"), *args],
            env={**self.env(), **(env or {})}, cwd=PLATFORM_DIR, capture_output=True, text=True,
        )
        if result.returncode != 0:
            raise StackError(f"manage.py {' '.join(args)} failed:\n{result.stdout}\n{result.stderr}")
        return result.stdout

    def prepare(self, *, username: str = "demo", password: str | None = None,
                project: str = "demo") -> Credentials:
        """Migrate the database and create the user (if missing), its project, environments and the trainer user.

        A new user gets ``password``, or a generated one (printed by the bootstrap this once).
        The well-known demo password is for a loopback stack only.
        """
        if password == DEMO_PASSWORD and self.config.host not in LOOPBACK_HOSTS:
            raise StackError(f"the demo password is only for a stack on loopback, not {self.config.host}")
        self.manage("migrate", "--noinput")
        output = self.manage(
            "tandem_bootstrap", "--username", username, "--project", project,
            "--trainer-username", "tandem-trainer",
            # In the environment, not argv: other local users can read a process's arguments.
            env={"TANDEM_BOOTSTRAP_PASSWORD": password} if password else None,
        )
        data = json.loads(output.strip().splitlines()[-1])
        return Credentials(
            username=data["username"], password=data["password"], user_token=data["user_token"],
            trainer_token=data["trainer_token"], project_id=int(data["project_id"]),
        )

    def _spawn(self, name: str, command: list[str], *, cwd: Path = REPO_ROOT, env: dict | None = None) -> None:
        log = open(self.log_dir / f"{name}.log", "ab")  # noqa: SIM115 - lives as long as the process
        self.processes[name] = subprocess.Popen(
            command, cwd=cwd, env=env or self.env(), stdout=log, stderr=subprocess.STDOUT,
            start_new_session=True,  # Ctrl-C reaches only us; we stop children in order
        )

    def start_web(self, *, ready_timeout_s: float = 60.0) -> None:
        self._spawn("web", [
            sys.executable, "-m", "uvicorn", "config.asgi:application",
            "--host", self.config.host, "--port", str(self.config.port), "--log-level", "warning",
        ], cwd=PLATFORM_DIR)
        deadline = time.monotonic() + ready_timeout_s
        while time.monotonic() < deadline:
            self.check_alive()
            try:
                if httpx.get(f"{self.config.platform_url}/api/", timeout=1).status_code < 500:
                    return
            except httpx.TransportError:
                pass
            time.sleep(0.2)
        raise StackError(f"web server did not answer within {ready_timeout_s}s; see {self.log_dir / 'web.log'}")

    def start_platform_worker(self) -> None:
        """The platform's Celery worker, with beat: records probe reports and runs health sweeps."""
        self._spawn("platform-worker", [
            sys.executable, "-m", "tandem.cli", "platform-worker",
            "--schedule-file", str(self.config.var_dir / "celerybeat-schedule"),
        ])

    def start_workers(self) -> None:
        for index in range(self.config.workers):
            self._spawn(f"worker-{index}", [
                sys.executable, "-m", "tandem.cli", "worker", "--name", f"rollouts-{index}@%h",
                "--concurrency", str(self.config.worker_concurrency),
            ])

    def start_trainer(self, *, trainer_token: str, name: str = "trainer") -> None:
        # The token goes in the environment: a process's argv is readable by every local user.
        self._spawn(name, [
            sys.executable, "-m", "tandem.cli", "trainer",
            "--platform-url", self.config.platform_url,
            "--checkpoint-dir", str(self.config.var_dir / "checkpoints"),
        ], env={**self.env(), "TANDEM_TRAINER_TOKEN": trainer_token})

    def start(self, credentials: Credentials) -> None:
        self.start_web()
        self.start_platform_worker()
        self.start_workers()
        self.start_trainer(trainer_token=credentials.trainer_token)

    def check_alive(self) -> None:
        for name, process in self.processes.items():
            if process.poll() is not None:
                raise StackError(
                    f"{name} exited with code {process.returncode}; see {self.log_dir / (name + '.log')}"
                )

    def stop(self, *, timeout_s: float = 20.0) -> None:
        """Stop the trainer first (it flushes telemetry), then producers, then the web server."""
        order = {"trainer": 0, "web": 2}
        for name in sorted(self.processes, key=lambda n: order.get(n.split("-")[0], 1)):
            process = self.processes[name]
            if process.poll() is None:
                os.killpg(process.pid, signal.SIGTERM)
        deadline = time.monotonic() + timeout_s
        for process in self.processes.values():
            try:
                process.wait(timeout=max(deadline - time.monotonic(), 0.1))
            except subprocess.TimeoutExpired:
                os.killpg(process.pid, signal.SIGKILL)
                process.wait()
        self.processes.clear()
