"""The test suite's own Redis and PostgreSQL, started for one run of it and stopped afterwards.

``make test`` and ``make test-fast`` run it around pytest::

    python -m tests.suite_services start --owner-pid $$   # prints the path of an env file to source
    python -m tests.suite_services stop FILE              # stops that run's servers, removes their data

``start`` picks free loopback ports and starts, under ``var/test-services/<run>/``:

* a ``redis-server`` (no persistence), whose URL becomes ``TANDEM_TEST_REDIS_URL``;
* a PostgreSQL cluster of its own (``initdb`` then ``pg_ctl``; as root, run as the ``postgres``
  system user, since PostgreSQL refuses to run as root), listening on 127.0.0.1 only with trust
  authentication, whose superuser role ``tandem`` owns a database named after the run:
  ``TANDEM_TEST_DATABASE_URL`` (Django's test runner creates ``test_<name>`` beside it, the
  end-to-end tests a database per stack). It also listens on a Unix socket of its own, in
  ``TANDEM_TEST_POSTGRES_SOCKET_DIR``: the multi-host tests' hosts live in network namespaces
  that cannot reach this machine's loopback, but they share its files;
* a Channels prefix of the run's own, ``TANDEM_TEST_CHANNELS_PREFIX``.

It needs only the standard library (and the servers' binaries), not the project's virtual
environment. The system's Redis and PostgreSQL (on 6379, 5432 or anywhere) are never used nor touched, so two
checkouts (or two runs of one) can run the suite at once beside a ``tandem up``. Servers left by
a run whose shell is gone (a killed ``make``) are stopped by the next ``start``.
"""

from __future__ import annotations

import argparse
import contextlib
import glob
import json
import os
import pwd
import secrets
import shlex
import shutil
import socket
import subprocess
import sys
import tempfile
import time
from dataclasses import asdict, dataclass
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parents[1]
SERVICES_DIR = REPO_ROOT / "var" / "test-services"
#: The cluster's superuser: the role every test connects as.
ROLE = "tandem"
#: PostgreSQL refuses to run as root; as root the cluster runs as this system user (Debian's package makes it).
POSTGRES_SYSTEM_USER = "postgres"
START_TIMEOUT_S = 60


class ServiceError(RuntimeError):
    """A server of the suite's could not be started; the message says what to install or fix."""


@dataclass
class RunState:
    """What ``stop`` needs to find one run's servers again (``state.json`` in the run's directory)."""

    run: str
    owner_pid: int
    redis_port: int
    redis_dir: str
    postgres_port: int
    postgres_data: str
    postgres_bin: str
    postgres_user: str | None  # the system user the cluster runs as, when started by root
    database: str
    postgres_socket_dir: str = ""

    def env(self) -> dict[str, str]:
        return {
            "TANDEM_TEST_REDIS_URL": f"redis://127.0.0.1:{self.redis_port}/0",
            "TANDEM_TEST_DATABASE_URL": f"postgresql://{ROLE}@127.0.0.1:{self.postgres_port}/{self.database}",
            "TANDEM_TEST_CHANNELS_PREFIX": f"tandem-test-{self.run}:channels",
            "TANDEM_TEST_POSTGRES_SOCKET_DIR": self.postgres_socket_dir,
        }


def _free_port() -> int:
    from tandem.runtime.local_ports import free_local_port  # stdlib only, as this whole module

    return free_local_port()


# --- Redis -------------------------------------------------------------------------------------

def _redis_command(port: int, command: str) -> bytes:
    """One inline command to the redis-server on ``port``, its first reply (b"" when it closed the connection)."""
    with socket.create_connection(("127.0.0.1", port), timeout=2) as connection:
        connection.sendall(f"{command}\r\n".encode())
        return connection.recv(256)


def _redis_answers(port: int) -> bool:
    try:
        return _redis_command(port, "PING").startswith(b"+PONG")
    except OSError:
        return False


def start_redis(directory: Path) -> int:
    """A daemonized redis-server on a free loopback port, its files in ``directory``; its port."""
    server = shutil.which("redis-server")
    if server is None:
        raise ServiceError("the tests need redis-server: run `sudo apt-get install redis-server` "
                           "(`make test` installs it when run as root)")
    directory.mkdir(parents=True, exist_ok=True)
    log = directory / "redis.log"
    for _ in range(5):  # a port picked free may be taken before redis-server binds it
        port = _free_port()
        logged = log.stat().st_size if log.exists() else 0
        started = subprocess.run(
            [server, "--port", str(port), "--bind", "127.0.0.1", "--daemonize", "yes", "--save", "",
             "--appendonly", "no", "--dir", str(directory), "--pidfile", str(directory / "redis.pid"),
             "--logfile", str(log)], capture_output=True, text=True)
        if started.returncode != 0:
            raise ServiceError(f"redis-server failed: {started.stdout}{started.stderr}")
        deadline = time.monotonic() + START_TIMEOUT_S
        while time.monotonic() < deadline:
            if _redis_answers(port):
                return port
            if "Address already in use" in _new_lines(log, logged):
                break
            time.sleep(0.05)
        else:
            raise ServiceError(f"redis-server on port {port} did not answer within {START_TIMEOUT_S} s:\n{_tail(log)}")
    raise ServiceError(f"redis-server found no free port:\n{_tail(log)}")


def _new_lines(path: Path, offset: int) -> str:
    if not path.exists():
        return ""
    with path.open("rb") as file:
        file.seek(offset)
        return file.read().decode(errors="replace")


def stop_redis(port: int, directory: Path) -> None:
    try:
        reply = _redis_command(port, "SHUTDOWN NOSAVE")
    except OSError:
        reply = b""  # gone already, or it closed the connection as it shut down
    if reply.startswith(b"-"):
        print(f"suite services: redis-server on {port} refused shutdown ({reply!r}); killing it", file=sys.stderr)
        _kill_pidfile(directory / "redis.pid")


def _kill_pidfile(pidfile: Path) -> None:
    with contextlib.suppress(OSError, ValueError, IndexError):
        os.kill(int(pidfile.read_text().split()[0]), 9)


def _tail(path: Path) -> str:
    return path.read_text(errors="replace")[-3000:] if path.exists() else ""


# --- PostgreSQL --------------------------------------------------------------------------------

def postgres_bin() -> Path:
    """The newest installed PostgreSQL's bin directory (Debian keeps it off PATH)."""
    candidates = sorted(glob.glob("/usr/lib/postgresql/*/bin/initdb"),
                        key=lambda path: int(Path(path).parts[-3]) if Path(path).parts[-3].isdigit() else 0)
    if candidates:
        return Path(candidates[-1]).parent
    on_path = shutil.which("initdb")
    if on_path:
        return Path(on_path).resolve().parent
    raise ServiceError("the tests need PostgreSQL's server (initdb, pg_ctl): run `sudo apt-get install postgresql` "
                       "(`make test` installs it when run as root)")


def _as_cluster_user(command: list[str], user: str | None) -> list[str]:
    return ["runuser", "-u", user, "--", *command] if user else command


def _cluster_user() -> str | None:
    if os.geteuid() != 0:
        return None
    try:
        pwd.getpwnam(POSTGRES_SYSTEM_USER)
    except KeyError:
        raise ServiceError(f"as root, the tests' PostgreSQL runs as the system user {POSTGRES_SYSTEM_USER!r}, which "
                           "does not exist: install Debian's `postgresql` package (it makes the user) or run as "
                           "another user") from None
    if shutil.which("runuser") is None:
        raise ServiceError("as root, the tests' PostgreSQL is started through runuser (util-linux), which is missing")
    return POSTGRES_SYSTEM_USER


def _owned_by(directory: Path, user: str | None) -> Path:
    """``directory``, given to the cluster's system user (when there is one)."""
    if user is not None:
        entry = pwd.getpwnam(user)
        os.chown(directory, entry.pw_uid, entry.pw_gid)
    return directory


def _cluster_directory(preferred: Path, user: str | None) -> Path:
    """``preferred``, or (as root, when the cluster's user cannot reach it) a private temporary directory."""
    preferred.mkdir(parents=True, exist_ok=True)
    if user is None:
        return preferred
    _owned_by(preferred, user)
    reachable = subprocess.run(_as_cluster_user(["test", "-w", str(preferred)], user)).returncode == 0
    if reachable:
        return preferred
    return _owned_by(Path(tempfile.mkdtemp(prefix="tandem-test-postgres-")), user)


#: A Unix socket's path is at most 107 bytes: a longer cluster directory gets a short one in /tmp for its socket.
_SOCKET_PATH_LIMIT = 100


def _socket_directory(parent: Path, user: str | None) -> Path:
    if len(str(parent / ".s.PGSQL.65535.lock")) <= _SOCKET_PATH_LIMIT:
        return parent
    return _owned_by(Path(tempfile.mkdtemp(prefix="tandem-pg-", dir="/tmp")), user)


def start_postgres(preferred_dir: Path, database: str) -> tuple[int, Path, Path, str | None, Path]:
    """A cluster of the suite's own on a free loopback port with ``database`` in it.

    Returns its port, data directory, bin directory, the system user it runs as (None: ours) and
    the directory of its Unix socket.
    """
    bin_dir = postgres_bin()
    user = _cluster_user()
    parent = _cluster_directory(preferred_dir, user)
    socket_dir = _socket_directory(parent, user)
    data = parent / "data"
    log = parent / "postgres.log"
    initdb = subprocess.run(
        _as_cluster_user([str(bin_dir / "initdb"), "-D", str(data), "-U", ROLE, "--auth=trust", "-E", "UTF8",
                          "--no-locale", "--no-sync"], user),
        cwd=parent, capture_output=True, text=True)
    if initdb.returncode != 0:
        raise ServiceError(f"initdb failed:\n{initdb.stdout}{initdb.stderr}")
    for _ in range(5):  # a port picked free may be taken before the postmaster binds it
        port = _free_port()
        logged = log.stat().st_size if log.exists() else 0
        options = (f"-c listen_addresses=127.0.0.1 -c port={port} -c unix_socket_directories='{socket_dir}' "
                   "-c fsync=off -c synchronous_commit=off -c full_page_writes=off -c max_connections=300")
        started = subprocess.run(
            _as_cluster_user([str(bin_dir / "pg_ctl"), "-D", str(data), "-l", str(log), "-w",
                              "-t", str(START_TIMEOUT_S), "-o", options, "start"], user),
            cwd=parent, capture_output=True, text=True)
        if started.returncode == 0:
            break
        if "already in use" not in _new_lines(log, logged):
            raise ServiceError(f"pg_ctl start failed:\n{started.stdout}{started.stderr}\n{_tail(log)}")
    else:
        raise ServiceError(f"PostgreSQL found no free port:\n{_tail(log)}")
    created = subprocess.run([str(bin_dir / "createdb"), "-h", "127.0.0.1", "-p", str(port), "-U", ROLE, database],
                             capture_output=True, text=True)
    if created.returncode != 0:
        raise ServiceError(f"createdb {database} failed:\n{created.stdout}{created.stderr}")
    return port, data, bin_dir, user, socket_dir


def stop_postgres(data: Path, bin_dir: Path, user: str | None) -> None:
    if not (data / "postmaster.pid").exists():
        return
    stopped = subprocess.run(
        _as_cluster_user([str(bin_dir / "pg_ctl"), "-D", str(data), "-m", "fast", "-w", "-t", "60", "stop"], user),
        cwd="/", capture_output=True, text=True)
    if stopped.returncode != 0:
        print(f"suite services: pg_ctl stop failed:\n{stopped.stdout}{stopped.stderr}", file=sys.stderr)


# --- one run -----------------------------------------------------------------------------------

def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def start(owner_pid: int) -> Path:
    """Start one run's servers; the path of the env file that names them."""
    stop_abandoned()
    run = f"{time.strftime('%Y%m%d%H%M%S')}-{secrets.token_hex(3)}"
    directory = SERVICES_DIR / run
    directory.mkdir(parents=True)
    state_file = directory / "state.json"
    redis_port = start_redis(directory / "redis")
    # Recorded at once: a failed PostgreSQL start must still stop this Redis.
    state = RunState(run=run, owner_pid=owner_pid, redis_port=redis_port, redis_dir=str(directory / "redis"),
                     postgres_port=0, postgres_data="", postgres_bin="", postgres_user=None,
                     database=f"tandem_{run.replace('-', '_')}")
    state_file.write_text(json.dumps(asdict(state)))
    try:
        port, data, bin_dir, user, socket_dir = start_postgres(directory / "postgres", state.database)
    except BaseException:
        stop(state_file)
        raise
    state.postgres_port, state.postgres_data, state.postgres_bin, state.postgres_user = (
        port, str(data), str(bin_dir), user)
    state.postgres_socket_dir = str(socket_dir)
    state_file.write_text(json.dumps(asdict(state)))
    env_file = directory / "suite.env"
    env_file.write_text("".join(f"{name}={shlex.quote(value)}\n" for name, value in state.env().items()))
    return env_file


def stop(path: Path) -> None:
    """Stop the servers of the run whose env file (or state file) is ``path``; remove their data."""
    directory = path.parent
    state = RunState(**json.loads((directory / "state.json").read_text()))
    stop_redis(state.redis_port, Path(state.redis_dir))
    if state.postgres_data:
        data = Path(state.postgres_data)
        stop_postgres(data, Path(state.postgres_bin), state.postgres_user)
        shutil.rmtree(data, ignore_errors=True)
        if data.parent != directory / "postgres":  # a temporary directory of its own (as root)
            shutil.rmtree(data.parent, ignore_errors=True)
    if state.postgres_socket_dir and Path(state.postgres_socket_dir) != Path(state.postgres_data).parent:
        shutil.rmtree(state.postgres_socket_dir, ignore_errors=True)  # a short one of its own in /tmp
    shutil.rmtree(directory, ignore_errors=True)


def stop_abandoned() -> None:
    """Stop the servers of runs whose shell is gone (a killed make left them running)."""
    for state_file in sorted(SERVICES_DIR.glob("*/state.json")):
        try:
            owner = json.loads(state_file.read_text())["owner_pid"]
        except (OSError, ValueError, KeyError):
            continue
        if not _alive(owner):
            print(f"suite services: stopping the servers of an abandoned run ({state_file.parent.name})",
                  file=sys.stderr)
            with contextlib.suppress(OSError):  # another run's start got there first
                stop(state_file)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m tests.suite_services", description=__doc__.splitlines()[0])
    commands = parser.add_subparsers(dest="command", required=True)
    started = commands.add_parser("start", help="start a run's servers and print the env file's path")
    started.add_argument("--owner-pid", type=int, required=True,
                         help="the process (the shell running pytest) whose exit leaves these servers abandoned: "
                              "a later start stops them")
    stopped = commands.add_parser("stop", help="stop the servers named by an env file that start printed")
    stopped.add_argument("env_file", type=Path)
    args = parser.parse_args(argv)
    try:
        if args.command == "start":
            print(start(args.owner_pid))
        else:
            stop(args.env_file)
    except ServiceError as exc:
        print(f"suite services: {exc}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
