"""Starting and stopping a whole Tandem on one machine: web, platform workers, export worker, producers, trainer.

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

from tandem.runtime.secrets_at_rest import (
    SECRETS_KEY_ENV,
    SECRETS_KEY_FILE_ENV,
    secrets_key_file_ensure,
)

REPO_ROOT = Path(__file__).resolve().parents[2]
PLATFORM_DIR = REPO_ROOT / "platform"


#: The password of ``tandem up --demo``'s user: well known, so only ever on loopback.
DEMO_PASSWORD = "demo"
LOOPBACK_HOSTS = frozenset({"127.0.0.1", "::1", "localhost"})


#: Connections and requests the web server serves at once (uvicorn --limit-concurrency).
WEB_CONCURRENCY_LIMIT = 256


class StackError(RuntimeError):
    pass


@dataclass
class StackConfig:
    redis_url: str
    database_url: str | None = None  # None: the platform's embedded SQLite, var_dir/tandem.sqlite3
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


# A crashed process is started again after a delay doubling from the first, up to the cap; one
# that stayed up this long before it crashed starts from the first delay again.
RESTART_FIRST_DELAY_S = 1.0
RESTART_MAX_DELAY_S = 60.0
RESTART_RESET_AFTER_S = 120.0


@dataclass
class Restart:
    """A crashed process the supervisor started again."""

    name: str
    exit_code: int
    count: int  # this process's restarts so far, this one included
    delay_s: float  # how long it waited for it


@dataclass
class _Supervised:
    command: list[str]
    cwd: Path
    env: dict[str, str] | None
    started_at: float
    restarts: int = 0
    delay_s: float = 0.0
    # When a crashed process is due to start again (None while it runs).
    restart_at: float | None = None
    exit_code: int = 0


class LocalStack:
    def __init__(self, config: StackConfig):
        self.config = config
        self.log_dir = config.var_dir / "logs"
        self.log_dir.mkdir(parents=True, exist_ok=True)
        self.processes: dict[str, subprocess.Popen] = {}
        self._supervised: dict[str, _Supervised] = {}

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
        # Every process gets the database named outright, never one inherited from the caller: two
        # stacks with var directories of their own must not share one (their bootstraps would
        # replace each other's trainer token, their trainers claim each other's runs).
        env["DATABASE_URL"] = self.config.database_url or f"sqlite:///{self.sqlite_path}"
        # Secret settings at rest are sealed with the operator's key, else with this stack's own,
        # written into its var directory on first start (tandem/runtime/secrets_at_rest.py).
        if not env.get(SECRETS_KEY_ENV) and not env.get(SECRETS_KEY_FILE_ENV):
            env[SECRETS_KEY_FILE_ENV] = str(secrets_key_file_ensure(self.config.var_dir / "secrets.key"))
        return env

    @property
    def sqlite_path(self) -> Path:
        """The embedded SQLite database of a stack without ``database_url``: in its var directory."""
        return self.config.var_dir / "tandem.sqlite3"

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
        with open(self.log_dir / f"{name}.log", "ab") as log:  # the child keeps its own copy
            self.processes[name] = subprocess.Popen(
                command, cwd=cwd, env=env or self.env(), stdout=log, stderr=subprocess.STDOUT,
                start_new_session=True,  # Ctrl-C reaches only us; we stop children in order
            )
        previous = self._supervised.get(name)
        self._supervised[name] = _Supervised(command=command, cwd=cwd, env=env, started_at=time.monotonic(),
                                             restarts=previous.restarts if previous else 0,
                                             delay_s=previous.delay_s if previous else 0.0)

    def supervise(self) -> list[Restart]:
        """Start crashed processes again, with backoff; returns the restarts made now.

        ``tandem up`` calls it every second: a trainer killed with SIGKILL, or a web
        server that crashed, comes back on its own, and each restart is logged to
        ``logs/supervisor.log``, while the rest of the stack keeps running. (The
        tests call :meth:`check_alive` instead: there a crash is a failure.)
        """
        now = time.monotonic()
        restarted = []
        for name, process in list(self.processes.items()):
            state = self._supervised[name]
            if state.restart_at is None:
                if process.poll() is None:
                    continue
                # Crashed: due again after the backoff, reset by a long enough life.
                lived_s = now - state.started_at
                state.delay_s = (RESTART_FIRST_DELAY_S if lived_s >= RESTART_RESET_AFTER_S or not state.delay_s
                                 else min(state.delay_s * 2, RESTART_MAX_DELAY_S))
                state.restart_at = now + state.delay_s
                state.exit_code = process.returncode
                self._log_supervision(f"{name} exited with code {process.returncode} after {lived_s:.0f}s; "
                                      f"restarting in {state.delay_s:g}s")
            if now < state.restart_at:
                continue
            self._spawn(name, state.command, cwd=state.cwd, env=state.env)
            fresh = self._supervised[name]
            fresh.restarts += 1
            restart = Restart(name=name, exit_code=state.exit_code, count=fresh.restarts, delay_s=state.delay_s)
            self._log_supervision(f"restarted {name} (restart {restart.count}, pid {self.processes[name].pid})")
            restarted.append(restart)
        return restarted

    def _log_supervision(self, line: str) -> None:
        with open(self.log_dir / "supervisor.log", "a") as log:
            log.write(f"{time.strftime('%Y-%m-%d %H:%M:%S')} {line}\n")

    def start_web(self, *, ready_timeout_s: float = 60.0) -> None:
        self._spawn("web", [
            sys.executable, "-m", "uvicorn", "config.asgi:application",
            "--host", self.config.host, "--port", str(self.config.port), "--log-level", "warning",
            # Connections past it are answered 503 at once: slow clients cannot pile up without end
            # (each one's body is also held to its route's cap and deadline, common/request_limits.py).
            "--limit-concurrency", str(WEB_CONCURRENCY_LIMIT),
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

    def start_platform_queue_workers(self) -> None:
        """A prefork worker for each platform queue whose tasks may wait: webhook posts, dataset storing."""
        from tandem.contracts import DATASETS_QUEUE, WEBHOOKS_QUEUE

        # Two webhook posts at once, so one slow receiver never holds every alert; one dataset at
        # a time, since storing one keeps a core busy (uploads queue behind it, each with a status).
        for queue, concurrency in ((WEBHOOKS_QUEUE, 2), (DATASETS_QUEUE, 1)):
            self._spawn(queue, [
                sys.executable, "-m", "tandem.cli", "platform-worker", "--queues", queue,
                "--name", f"{queue}@%h", "--concurrency", str(concurrency),
            ])

    def start_export_worker(self) -> None:
        """The export worker (trainer/export_worker.py): checkpoints' safetensors exports, where JAX is."""
        self._spawn("export-worker", [
            sys.executable, "-m", "trainer.export_worker", "--name", "exports@%h",
        ], env=self._trainer_env())

    def start_workers(self) -> None:
        for index in range(self.config.workers):
            self.start_worker(index)
        self.start_probe_worker()

    def start_probe_worker(self) -> None:
        """A worker for environment probes and health checks alone, so that they never wait behind
        episodes: a rollout worker whose threads all run episodes takes nothing else meanwhile (it
        consumes probes too, when it has a thread free)."""
        from tandem.contracts import PROBE_QUEUE

        self._spawn("probe-worker", [
            sys.executable, "-m", "workers", "--queues", PROBE_QUEUE, "--name", "probes@%h", "--concurrency", "2",
        ])

    def start_worker(self, index: int) -> None:
        """Rollout worker ``worker-{index}`` (one more producer process; ``start_workers`` starts them all)."""
        self._spawn(f"worker-{index}", [
            sys.executable, "-m", "workers", "--name", f"rollouts-{index}@%h",
            "--concurrency", str(self.config.worker_concurrency),
        ])

    def start_trainer(self, *, trainer_token: str, name: str = "trainer") -> None:
        # The token goes in the environment: a process's argv is readable by every local user.
        self._spawn(name, [
            sys.executable, "-m", "trainer", "--platform-url", self.config.platform_url,
            "--checkpoint-dir", str(self.config.var_dir / "checkpoints"),
        ], env={**self._trainer_env(), "TANDEM_TRAINER_TOKEN": trainer_token})

    def _trainer_env(self) -> dict[str, str]:
        """The trainer's environment: the stack's, without the secrets key (it never reads a secret)."""
        return {name: value for name, value in self.env().items()
                if name not in (SECRETS_KEY_ENV, SECRETS_KEY_FILE_ENV)}

    def start(self, credentials: Credentials) -> None:
        self.start_web()
        self.start_platform_worker()
        self.start_platform_queue_workers()
        self.start_export_worker()
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
