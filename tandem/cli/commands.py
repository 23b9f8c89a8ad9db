"""The ``tandem`` command: ``up`` for a whole local Tandem, ``trainer`` and ``worker`` for one part."""

from __future__ import annotations

import argparse
import logging
import os
import signal
import sys
import time
from pathlib import Path

DEFAULT_REDIS_URL = "redis://127.0.0.1:6379/0"


def _redis_url(args) -> str:
    return args.redis_url or os.environ.get("REDIS_URL", DEFAULT_REDIS_URL)


def _stop_on_sigterm() -> None:
    """Turn SIGTERM (and Ctrl-C) into KeyboardInterrupt so ``finally`` blocks run on a clean stop."""

    def handler(signum, frame):
        raise KeyboardInterrupt

    signal.signal(signal.SIGTERM, handler)
    # A shell that starts us in the background hands SIGINT down as ignored;
    # Ctrl-C must still stop everything cleanly.
    signal.signal(signal.SIGINT, signal.default_int_handler)


def cmd_trainer(args) -> int:
    from trainer.main import LostProcessError, exit_for_restart, serve

    _stop_on_sigterm()
    token = args.token or os.environ.get("TANDEM_TRAINER_TOKEN")
    if not token:
        print("tandem trainer: pass --token or set TANDEM_TRAINER_TOKEN (the API token of a user in the tandem-trainers group)",
              file=sys.stderr)
        return 2
    try:
        serve(platform_url=args.platform_url, token=token, redis_url=_redis_url(args),
              checkpoint_root=Path(args.checkpoint_dir), max_runs=args.max_runs)
    except KeyboardInterrupt:
        logging.getLogger("tandem.trainer").info("trainer stopped")
    except LostProcessError as exc:
        exit_for_restart(exc)  # its run is queued again; every process of the job must start again
    return 0


def cmd_worker(args) -> int:
    os.environ["REDIS_URL"] = _redis_url(args)
    # The inference engine sizes its batch for every task thread's episodes.
    os.environ["TANDEM_WORKER_CONCURRENCY"] = str(args.concurrency)
    from workers.app import app

    # Threads, not prefork: nothing forks after JAX starts, and the task threads
    # of one process share its inference engine, which batches their episodes together.
    argv = ["worker", "--pool", "threads", "--concurrency", str(args.concurrency), "--queues", args.queues,
            "--loglevel", args.loglevel, "--without-gossip", "--without-mingle"]
    if args.name:
        argv += ["--hostname", args.name]
    app.worker_main(argv)
    return 0


def cmd_platform_worker(args) -> int:
    """A platform Celery worker: by default the one with Celery beat inside (probe reports, health
    sweeps, the run reaper); with ``--queues platform-webhooks`` or ``platform-datasets``, a prefork
    worker of its own for the work that waits on the outside world or on big files."""
    platform_dir = Path(__file__).resolve().parents[2] / "platform"
    sys.path.insert(0, str(platform_dir))
    os.environ["REDIS_URL"] = _redis_url(args)
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "config.settings.dev")
    import django

    django.setup()
    from config.celery import app
    from tandem.contracts import PLATFORM_QUEUE

    queues = args.queues or PLATFORM_QUEUE
    # The platform queue's tasks are short database writes: a solo pool. Other queues' tasks may
    # wait (on a receiver, on a big file): prefork, whose parent enforces the tasks' time limits by
    # killing a stuck child, which a solo pool cannot do.
    pool = args.pool or ("solo" if queues == PLATFORM_QUEUE else "prefork")
    argv = ["worker", "--pool", pool, "--queues", queues, "--loglevel", args.loglevel,
            "--without-gossip", "--without-mingle", "--hostname", args.name]
    if pool != "solo":
        argv += ["--concurrency", str(args.concurrency)]
    # Beat runs inside the platform queue's worker, so run exactly one of those (a second would
    # double every health sweep); the other queues' workers never run it.
    if queues == PLATFORM_QUEUE and not args.no_beat:
        schedule = Path(args.schedule_file)
        schedule.parent.mkdir(parents=True, exist_ok=True)
        argv += ["--beat", "--schedule", str(schedule)]
    app.worker_main(argv)
    return 0


def _progress_line(client, run_id: int) -> tuple[str, str]:
    run = client.get(f"/api/runs/{run_id}/").json()
    latest: dict[str, float] = {}
    after = max(run.get("trainer_step", 0) - 5, -1)
    points = client.get(f"/api/runs/{run_id}/metrics/", params={"after_step": after}).json()["points"]
    for point in points:
        latest[point["name"]] = point["value"]
    reward = latest.get("reward_mean")
    idle = latest.get("trainer_idle_fraction")
    line = (
        f"run {run_id} [{run['status']}] step {run['trainer_step']} "
        f"policy v{run['policy_version']} "
        f"reward {'-' if reward is None else f'{reward:.2f}'} "
        f"success {'-' if latest.get('success_rate') is None else format(latest['success_rate'], '.2f')} "
        f"trainer idle {'-' if idle is None else f'{idle:.0%}'}"
    )
    return line, run["status"]


def _supervise(stack) -> None:
    """Start the stack's crashed processes again (with backoff), and say so."""
    for restart in stack.supervise():
        print(f"\n{restart.name} exited with code {restart.exit_code}: restarted after {restart.delay_s:g}s "
              f"(restart {restart.count}; see {stack.log_dir / 'supervisor.log'})", flush=True)


def cmd_up(args) -> int:
    import httpx

    from tandem.cli.local_redis import ServiceUnavailableError, ensure_redis
    from tandem.cli.stack import DEMO_PASSWORD, LocalStack, StackConfig, StackError
    from tandem.configs.demo_runs import DemoModelMissingError, demo_run
    from tandem.contracts import TERMINAL_RUN_STATUSES, RunStatus

    demo = None
    if args.demo:
        try:
            demo = demo_run(args.model, rl_steps=args.rl_steps)
        except DemoModelMissingError as exc:
            print(f"tandem up: {exc}", file=sys.stderr)
            return 1
    _stop_on_sigterm()
    config = StackConfig(redis_url=_redis_url(args), port=args.port, workers=args.workers,
                         database_url=os.environ.get("DATABASE_URL"),
                         **({"var_dir": Path(args.var_dir).resolve()} if args.var_dir else {}))
    stack = LocalStack(config)
    redis_process = None
    try:
        try:
            redis_process = ensure_redis(config.redis_url, log_path=str(stack.log_dir / "redis.log"))
        except ServiceUnavailableError as exc:
            print(f"tandem up: {exc}", file=sys.stderr)
            return 1
        if redis_process is not None:
            print(f"started redis-server for {config.redis_url}")
        credentials = stack.prepare(password=DEMO_PASSWORD if args.demo else None)
        stack.start(credentials)
        password = credentials.password or "the password printed when it was created"
        print(f"dashboard: {config.platform_url}/runs/  (login {credentials.username} / {password})")
        print(f"environments and their probes: {config.platform_url}/environments/")
        print(f"API token for {credentials.username}: {credentials.user_token}")
        print(f"logs: {stack.log_dir}")
        if not args.demo:
            print("Tandem is up. Ctrl-C stops everything.")
            while True:
                _supervise(stack)
                time.sleep(1)
        client = httpx.Client(base_url=config.platform_url,
                              headers={"Authorization": f"Token {credentials.user_token}"}, timeout=10)
        response = client.post("/api/runs/", json={
            "project": credentials.project_id, "name": demo.name, "environment": demo.environment,
            "config": demo.config,
        })
        if response.status_code != 201:
            print(f"tandem up: could not create the demo run: {response.status_code} {response.text}",
                  file=sys.stderr)
            return 1
        run_id = response.json()["id"]
        print(f"demo run {run_id}: {config.platform_url}/runs/{run_id}/")
        status = RunStatus.QUEUED
        while True:
            _supervise(stack)
            try:
                line, status = _progress_line(client, run_id)
            except httpx.TransportError:
                # The web server is restarting (the supervisor brings it back): the run goes on.
                time.sleep(1)
                continue
            print("\r" + line.ljust(110), end="", flush=True)
            if status in TERMINAL_RUN_STATUSES:
                print()
                if args.exit_when_done:
                    return 0 if status == RunStatus.FINISHED else 1
                print(f"run {status}. The dashboard stays up; Ctrl-C stops everything.")
                while True:
                    _supervise(stack)
                    time.sleep(1)
            time.sleep(1)
    except KeyboardInterrupt:
        print("\nstopping ...")
        return 0
    except StackError as exc:
        print(f"\ntandem up: {exc}", file=sys.stderr)
        return 1
    finally:
        stack.stop()
        if redis_process is not None:
            redis_process.terminate()
            redis_process.wait(timeout=10)
        print("stopped.")


def cmd_models_import(args) -> int:
    """A GGUF file or a Hugging Face directory, as a Tandem-ready Hugging Face directory."""
    from policy import ModelImportError, import_model

    try:
        destination = import_model(args.source, args.destination)
    except ModelImportError as exc:
        print(f"tandem models import: {exc}", file=sys.stderr)
        return 2
    print(f"imported {args.source} into {destination}: use it as model.hf_checkpoint and model.tokenizer")
    return 0


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="tandem", description=__doc__)
    parser.add_argument("--redis-url", help=f"default: $REDIS_URL or {DEFAULT_REDIS_URL}")
    commands = parser.add_subparsers(dest="command", required=True)

    up = commands.add_parser(
        "up", help="start web, the platform worker with beat, rollout workers and a trainer on this machine")
    up.add_argument("--port", type=int, default=8000)
    up.add_argument("--workers", type=int, default=2, help="rollout worker processes")
    up.add_argument("--demo", action="store_true", help="submit a demo run and show its progress")
    up.add_argument("--rl-steps", type=int, help="override the demo run's rl_steps")
    up.add_argument("--var-dir", help="where logs, checkpoints and the embedded database go; default var/")
    up.add_argument("--model", choices=("nano", "smollm2"), default="nano",
                    help="the demo's policy: nano (a byte model trained from scratch) or smollm2 "
                         "(SmolLM2-135M-Instruct, imported by make models)")
    up.add_argument("--exit-when-done", action="store_true", help="stop everything when the demo run ends")
    up.set_defaults(func=cmd_up)

    trainer = commands.add_parser("trainer", help="run a trainer process")
    trainer.add_argument("--platform-url", default=os.environ.get("TANDEM_PLATFORM_URL", "http://127.0.0.1:8000"))
    trainer.add_argument("--token", help="a trainer's API token (tandem-trainers group); default $TANDEM_TRAINER_TOKEN")
    trainer.add_argument("--checkpoint-dir", default=os.environ.get("TANDEM_CHECKPOINT_ROOT")
                         or os.environ.get("TANDEM_CHECKPOINT_DIR", "var/checkpoints"),
                         help="the checkpoint root; default $TANDEM_CHECKPOINT_ROOT (the platform's too)")
    trainer.add_argument("--max-runs", type=int, help="exit after training this many runs")
    trainer.set_defaults(func=cmd_trainer)

    worker = commands.add_parser("worker", help="run a Celery rollout worker process")
    worker.add_argument("--name", help="Celery node name, e.g. rollouts-1@%%h")
    worker.add_argument("--loglevel", default="INFO")
    worker.add_argument("--concurrency", type=int, default=4,
                        help="rollout tasks this process runs at once (each runs many episodes)")
    worker.add_argument("--queues", default="rollouts,probes,evaluations",
                        help="Celery queues to consume: rollouts (episodes), probes (environment probes) and "
                        "evaluations (held-out evaluation episodes)")
    worker.set_defaults(func=cmd_worker)

    platform_worker = commands.add_parser(
        "platform-worker", help="run the platform's Celery worker and beat (probe reports, health checks, reaper)")
    platform_worker.add_argument("--name", default="platform@%h")
    platform_worker.add_argument("--loglevel", default="INFO")
    platform_worker.add_argument("--schedule-file", default=os.environ.get(
        "TANDEM_BEAT_SCHEDULE", "var/celerybeat-schedule"), help="where Celery beat keeps its state")
    platform_worker.add_argument("--no-beat", action="store_true",
                                 help="do not run Celery beat here (it runs in another process)")
    platform_worker.add_argument(
        "--queues", default=None,
        help="the queue to consume: platform (the default, with beat), platform-webhooks or platform-datasets")
    platform_worker.add_argument("--pool", default=None, choices=("solo", "prefork"),
                                 help="Celery pool (default: solo for platform, prefork for the others)")
    platform_worker.add_argument("--concurrency", type=int, default=2,
                                 help="child processes of a prefork worker")
    platform_worker.set_defaults(func=cmd_platform_worker)

    models = commands.add_parser("models", help="bring a pretrained model").add_subparsers(
        dest="models_command", required=True)
    model_import = models.add_parser(
        "import", help="a GGUF file or a Hugging Face directory as a Tandem-ready Hugging Face directory "
        "(safetensors, config.json, tokenizer.json, the chat template), dequantized")
    model_import.add_argument("source", help="a .gguf file, or a directory with config.json and *.safetensors")
    model_import.add_argument("destination", help="the directory to write, e.g. var/models/<name>")
    model_import.set_defaults(func=cmd_models_import)

    from tandem.cli.client_commands import (
        register_subcommands,  # login, runs, envs: the platform's API
    )
    register_subcommands(commands)
    from tandem.cli.dataset_commands import register_dataset_subcommands  # datasets: SFT data
    register_dataset_subcommands(commands)
    return parser


def main(argv: list[str] | None = None) -> int:
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(levelname)s %(message)s")
    # One line per HTTP request would bury the progress line and the trainer's log.
    logging.getLogger("httpx").setLevel(logging.WARNING)
    args = build_parser().parse_args(argv)
    return args.func(args)


if __name__ == "__main__":
    sys.exit(main())
