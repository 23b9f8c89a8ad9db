"""What a dataset upload costs the web process, and how long it makes another user's write wait.

Against a platform served as ``tandem up`` serves it (one uvicorn process, Redis), with the datasets
worker (queue platform-datasets) where the checkout has one, on a fresh PostgreSQL database
``<DATABASE_URL's name>_datasets_bench`` (dropped afterwards), or with ``--database sqlite`` a fresh
SQLite file:

- ``bad``: an upload of ``--bad-mib`` MiB of bad lines (``x``, each): the answer's time and the web process's
  peak RSS (VmHWM) over its RSS before (a fresh web process);
- ``valid``: an upload of ``--valid-mib`` MiB of valid conversations while another user saves their
  metric-explorer layout (a small write) every 50 ms, from before the upload until its rows are stored:
  the longest such write, the upload's answer time, the time until its rows are stored, peak RSS.

``--repo`` serves another checkout (an older commit, say, unpacked with ``git archive``) with this
checkout's virtual environment, for before and after in one session. Prints one JSON line.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import httpx
import psycopg

HERE = Path(__file__).resolve().parents[1]
ROW = {"messages": [{"role": "system", "content": "You are a careful assistant."},
                    {"role": "user", "content": "What is 17 times 23? Show the steps briefly."},
                    {"role": "assistant", "content": "17 x 23 = 17 x 20 + 17 x 3 = 340 + 51 = 391."}],
       "metadata": {"source": "bench"}}
SETUP = """
import json
from accounts.services import project_create, user_create_with_token
owner, owner_token = user_create_with_token(username="uploader", password="pw")
project = project_create(owner=owner, name="bench")
other, other_token = user_create_with_token(username="other", password="pw")
print(json.dumps({"project": project.pk, "owner": owner_token, "other": other_token}))
"""


def _database_urls() -> tuple[str, str, str]:
    base = os.environ.get("DATABASE_URL", "postgres://postgres@127.0.0.1:5432/tandem")
    server, _, name = base.rpartition("/")
    bench = f"{name}_datasets_bench"
    return f"{server}/postgres", f"{server}/{bench}", bench


def _rss_kib(pid: int, key: str) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith(key + ":"):
            return int(line.split()[1])
    raise RuntimeError(f"no {key} for {pid}")


class Platform:
    def __init__(self, repo: Path, env: dict[str, str], log_dir: Path):
        self.repo, self.env, self.log_dir = repo, env, log_dir
        self.port = 18000 + os.getpid() % 1000
        self.url = f"http://127.0.0.1:{self.port}"
        self.web: subprocess.Popen | None = None
        self.worker: subprocess.Popen | None = None

    def manage(self, *args: str) -> str:
        return subprocess.run([sys.executable, "manage.py", *args], cwd=self.repo / "platform", env=self.env,
                              check=True, capture_output=True, text=True).stdout

    def start_web(self) -> None:
        self.stop_web()
        with (self.log_dir / "web.log").open("ab") as log:
            self.web = subprocess.Popen([sys.executable, "-m", "uvicorn", "config.asgi:application", "--host",
                                         "127.0.0.1", "--port", str(self.port), "--log-level", "warning"],
                                        cwd=self.repo / "platform", env=self.env, stdout=log, stderr=subprocess.STDOUT)
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            try:
                if httpx.get(f"{self.url}/api/", timeout=1).status_code < 500:
                    return
            except httpx.TransportError:
                time.sleep(0.2)
        raise RuntimeError("the web process did not start")

    def start_worker(self) -> bool:
        if not (self.repo / "platform" / "dataset_registry" / "tasks.py").is_file():
            return False  # before the datasets worker: the web process stores every row itself
        with (self.log_dir / "worker.log").open("ab") as log:
            self.worker = subprocess.Popen(
                [sys.executable, "-m", "celery", "-A", "config.celery", "worker", "-Q", "platform-datasets",
                 "--pool", "prefork", "-c", "1", "--loglevel", "WARNING"],
                cwd=self.repo / "platform", env=self.env, stdout=log, stderr=subprocess.STDOUT)
        return True

    def stop_web(self) -> None:
        if self.web is not None:
            self.web.terminate()
            self.web.wait(timeout=20)
            self.web = None

    def stop(self) -> None:
        self.stop_web()
        if self.worker is not None:
            self.worker.terminate()
            self.worker.wait(timeout=30)


def _upload(platform: Platform, token: str, project: int, name: str, path: Path) -> tuple[httpx.Response, float]:
    started = time.monotonic()
    with path.open("rb") as file:
        response = httpx.post(f"{platform.url}/api/datasets/", headers={"Authorization": f"Token {token}"},
                              data={"project": str(project), "name": name},
                              files={"file": (path.name, file, "application/jsonl")}, timeout=600)
    return response, time.monotonic() - started


def _wait_stored(platform: Platform, token: str, response: httpx.Response) -> None:
    if response.status_code != 202:
        return  # stored by the answer itself (201), or refused
    body = response.json()
    path = f"{platform.url}/api/datasets/{body['id']}/versions/{body['latest_version']['number']}/"
    while (version := httpx.get(path, headers={"Authorization": f"Token {token}"}).json())["status"] != "ready":
        if version["status"] == "failed":
            raise RuntimeError(version["failure_reason"])
        time.sleep(0.2)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--repo", type=Path, default=HERE, help="the checkout to serve (default: this one)")
    parser.add_argument("--bad-mib", type=float, default=8.0)
    parser.add_argument("--valid-mib", type=float, default=40.0)
    parser.add_argument("--database", choices=("postgres", "sqlite"), default="postgres",
                        help="sqlite: a file of its own, as a `tandem up` without DATABASE_URL has")
    args = parser.parse_args()

    admin_url, bench_url, bench_name = _database_urls()
    work = Path(tempfile.mkdtemp(prefix="dataset-bench-"))
    if args.database == "sqlite":
        bench_url = f"sqlite:///{work / 'bench.sqlite3'}"
    else:
        with psycopg.connect(admin_url, autocommit=True) as admin:
            admin.execute(f'DROP DATABASE IF EXISTS "{bench_name}" WITH (FORCE)')
            admin.execute(f'CREATE DATABASE "{bench_name}"')
    env = {**os.environ, "DATABASE_URL": bench_url, "DJANGO_SETTINGS_MODULE": "config.settings.test",
           "TANDEM_MEDIA_ROOT": str(work / "media"), "PYTHONPATH": str(args.repo),
           "TANDEM_DATASET_PROJECT_MAX_BYTES": str(2**40)}
    platform = Platform(args.repo.resolve(), env, work)
    result: dict = {"repo": str(args.repo), "database": args.database, "worker": False}
    try:
        platform.manage("migrate", "--no-input")
        ids = json.loads(platform.manage("shell", "-c", SETUP).strip().splitlines()[-1])
        result["worker"] = platform.start_worker()

        bad_line = b"x\n"  # the cheapest bad line: the most lines, and so the most errors, per MiB
        bad = work / "bad.jsonl"
        bad.write_bytes(bad_line * int(args.bad_mib * 2**20 // len(bad_line)))
        valid_line = json.dumps(ROW).encode() + b"\n"
        valid = work / "valid.jsonl"
        valid.write_bytes(valid_line * int(args.valid_mib * 2**20 // len(valid_line)))

        platform.start_web()
        rss_before = _rss_kib(platform.web.pid, "VmRSS")
        response, seconds = _upload(platform, ids["owner"], ids["project"], "bad", bad)
        result["bad"] = {"mib": args.bad_mib, "status": response.status_code, "answer_s": round(seconds, 2),
                         "errors_listed": len((response.json().get("error") or {}).get("fields", {}).get("file", [])),
                         "web_rss_before_mib": round(rss_before / 1024, 1),
                         "web_peak_rss_mib": round(_rss_kib(platform.web.pid, "VmHWM") / 1024, 1)}

        platform.start_web()
        rss_before = _rss_kib(platform.web.pid, "VmRSS")
        waits: list[float] = []
        done = threading.Event()

        def other_user_writes() -> None:
            with httpx.Client(base_url=platform.url, headers={"Authorization": f"Token {ids['other']}"},
                              timeout=600) as client:
                while not done.is_set():
                    started = time.monotonic()
                    client.put("/api/metric-explorer/layout/", json={"page": "run", "smoothing": 0.5, "panels": []}
                               ).raise_for_status()
                    waits.append(time.monotonic() - started)
                    time.sleep(0.05)

        writer = threading.Thread(target=other_user_writes)
        writer.start()
        time.sleep(1.0)
        started = time.monotonic()
        response, answer_s = _upload(platform, ids["owner"], ids["project"], "valid", valid)
        _wait_stored(platform, ids["owner"], response)
        stored_s = time.monotonic() - started
        time.sleep(0.5)
        done.set()
        writer.join()
        result["valid"] = {"mib": args.valid_mib, "rows": valid.stat().st_size // len(valid_line),
                           "status": response.status_code, "answer_s": round(answer_s, 2),
                           "stored_s": round(stored_s, 2), "other_write_max_wait_s": round(max(waits), 3),
                           "other_write_median_s": round(sorted(waits)[len(waits) // 2], 3),
                           "other_writes": len(waits), "web_rss_before_mib": round(rss_before / 1024, 1),
                           "web_peak_rss_mib": round(_rss_kib(platform.web.pid, "VmHWM") / 1024, 1)}
        if platform.worker is not None:  # the prefork child that stored the rows
            children = Path(f"/proc/{platform.worker.pid}/task/{platform.worker.pid}/children").read_text().split()
            result["valid"]["worker_child_peak_rss_mib"] = round(
                max(_rss_kib(int(child), "VmHWM") for child in children) / 1024, 1)
    finally:
        platform.stop()
        if args.database == "postgres":
            with psycopg.connect(admin_url, autocommit=True) as admin:
                admin.execute(f'DROP DATABASE IF EXISTS "{bench_name}" WITH (FORCE)')
        shutil.rmtree(work, ignore_errors=True)
    print(json.dumps(result))


if __name__ == "__main__":
    main()
