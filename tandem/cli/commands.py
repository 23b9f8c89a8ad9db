"""The ``tandem`` command: ``up`` for a whole local Tandem, ``trainer`` and ``worker`` for one part."""

from __future__ import annotations

import argparse
import logging
import os
import sys
import time
from pathlib import Path
from typing import NoReturn

from tandem.runtime.process_start import DEFAULT_REDIS_URL, stop_on_sigterm

REPO_ROOT = Path(__file__).resolve().parents[2]


def _redis_url(args) -> str:
    return args.redis_url or os.environ.get("REDIS_URL", DEFAULT_REDIS_URL)


def _become(command: list[str], *, env: dict[str, str] | None = None) -> NoReturn:
    """Become ``command`` (``python -m ...``): the same process, so its pid, signals and exit code are
    the caller's, while the command line imports nothing of what it starts."""
    sys.stdout.flush()
    sys.stderr.flush()
    os.execve(command[0], command, os.environ if env is None else env)


def _passed_on(args) -> list[str]:
    """The arguments after the command, with the ``--redis-url`` given before it."""
    return (["--redis-url", args.redis_url] if args.redis_url else []) + args.passed_on


def cmd_trainer(args) -> int:
    """``python -m trainer`` with the same arguments (trainer/__main__.py)."""
    _become([sys.executable, "-m", "trainer", *_passed_on(args)])


def cmd_worker(args) -> int:
    """``python -m workers`` with the same arguments (workers/__main__.py)."""
    _become([sys.executable, "-m", "workers", *_passed_on(args)])


def cmd_inference_server(args) -> int:
    """``python -m workers.inference_server`` with the same arguments: a vLLM server for remote generation."""
    _become([sys.executable, "-m", "workers.inference_server", *_passed_on(args)])


def cmd_export_worker(args) -> int:
    """``python -m trainer.export_worker`` with the same arguments: checkpoints' safetensors exports."""
    _become([sys.executable, "-m", "trainer.export_worker", *_passed_on(args)])


def platform_worker_command(*, queues: str | None = None, pool: str | None = None, concurrency: int = 2,
                            name: str = "platform@%h", loglevel: str = "INFO",
                            schedule_file: str | Path = "var/celerybeat-schedule",
                            beat: bool = True) -> list[str]:
    """The platform's Celery app's worker (platform/config/celery.py), as ``python -m celery -A config``.

    By default the one with Celery beat inside (probe reports, health sweeps, the run reaper); with
    ``queues`` platform-webhooks or platform-datasets, a prefork worker of its own for the work that
    waits on the outside world or on big files. It needs platform/ on its path
    (:func:`platform_worker_env`).
    """
    from tandem.contracts import PLATFORM_QUEUE

    queues = queues or PLATFORM_QUEUE
    # The platform queue's tasks are short database writes: a solo pool. Other queues' tasks may
    # wait (on a receiver, on a big file): prefork, whose parent enforces the tasks' time limits by
    # killing a stuck child, which a solo pool cannot do.
    pool = pool or ("solo" if queues == PLATFORM_QUEUE else "prefork")
    command = [sys.executable, "-m", "celery", "-A", "config", "worker", "--pool", pool, "--queues", queues,
               "--loglevel", loglevel, "--without-gossip", "--without-mingle", "--hostname", name]
    if pool != "solo":
        command += ["--concurrency", str(concurrency)]
    # Beat runs inside the platform queue's worker, so run exactly one of those (a second would
    # double every health sweep); the other queues' workers never run it.
    if queues == PLATFORM_QUEUE and beat:
        command += ["--beat", "--schedule", str(schedule_file)]
    return command


def platform_worker_env(redis_url: str) -> dict[str, str]:
    """This process's environment, with the platform (and this repository) on the path, and Redis named."""
    env = {**os.environ, "REDIS_URL": redis_url}
    env.setdefault("DJANGO_SETTINGS_MODULE", "config.settings.dev")
    env["PYTHONPATH"] = os.pathsep.join(
        part for part in (str(REPO_ROOT / "platform"), str(REPO_ROOT), env.get("PYTHONPATH", "")) if part)
    return env


def cmd_platform_worker(args) -> int:
    """A platform Celery worker (:func:`platform_worker_command`): this process becomes it."""
    beat = not args.no_beat
    command = platform_worker_command(queues=args.queues, pool=args.pool, concurrency=args.concurrency,
                                      name=args.name, loglevel=args.loglevel,
                                      schedule_file=args.schedule_file, beat=beat)
    if "--beat" in command:
        Path(args.schedule_file).parent.mkdir(parents=True, exist_ok=True)
    _become(command, env=platform_worker_env(_redis_url(args)))


def _supervise(stack) -> None:
    """Start the stack's crashed processes again (with backoff), and say so."""
    for restart in stack.supervise():
        print(f"\n{restart.name} exited with code {restart.exit_code}: restarted after {restart.delay_s:g}s "
              f"(restart {restart.count}; see {stack.log_dir / 'supervisor.log'})", flush=True)


def _watch_demo(stack, credentials, demo, *, exit_when_done: bool) -> int:
    """Submit the demo run and redraw its progress line until it ends, supervising the stack meanwhile."""
    from tandem.cli.client_commands import watch_line
    from tandem.contracts import RunStatus
    from tandem.sdk.client import TandemAPIError, TandemClient

    with TandemClient(stack.config.platform_url, credentials.user_token, timeout=10) as client:
        try:
            run = client.runs.create(environment=demo.environment, config=demo.config, name=demo.name,
                                     project=credentials.project_id)
        except TandemAPIError as exc:
            print(f"tandem up: could not create the demo run: {exc}", file=sys.stderr)
            return 1
        print(f"demo run {run.id}: {stack.config.platform_url}/runs/{run.id}/")
        # Polled, so the stack is supervised once a poll: while the web server restarts (the
        # supervisor brings it back) the last known progress stays on the line and the run goes on.
        width = 0  # the longest line so far: a shorter one overwrites all of it
        for progress in client.runs.poll_progress(run.id, poll_interval_s=1.0):
            _supervise(stack)
            line = watch_line(progress.run, progress.step, progress.latest, bar=True, idle=True)
            width = max(width, len(line))
            print("\r" + line.ljust(width), end="", flush=True)
            run = progress.run
    print()
    if exit_when_done:
        return 0 if run.status == RunStatus.FINISHED else 1
    print(f"run {run.status}. The dashboard stays up; Ctrl-C stops everything.")
    while True:
        _supervise(stack)
        time.sleep(1)


def cmd_up(args) -> int:
    from tandem.cli.local_redis import ServiceUnavailableError, ensure_redis
    from tandem.cli.stack import DEMO_PASSWORD, LocalStack, StackConfig, StackError
    from tandem.configs.demo_runs import DemoModelMissingError, demo_run

    demo = None
    if args.demo:
        try:
            demo = demo_run(args.model, rl_steps=args.rl_steps)
        except DemoModelMissingError as exc:
            print(f"tandem up: {exc}", file=sys.stderr)
            return 1
    stop_on_sigterm()
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
        return _watch_demo(stack, credentials, demo, exit_when_done=args.exit_when_done)
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
    """A GGUF file or a Hugging Face directory, as a Tandem-ready Hugging Face directory: ``python -m policy import``."""
    template = ["--chat-template", args.chat_template] if args.chat_template else []
    _become([sys.executable, "-m", "policy", "import", args.source, args.destination, *template])


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="tandem", description=__doc__)
    parser.add_argument("--redis-url", help=f"default: $REDIS_URL or {DEFAULT_REDIS_URL}")
    commands = parser.add_subparsers(dest="command", required=True)

    up = commands.add_parser(
        "up", help="start web, the platform worker with beat, its webhooks and datasets workers, the export worker, "
        "rollout workers and a trainer on this machine")
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

    # The processes' own command lines take these arguments (python -m trainer --help, python -m
    # workers --help): they are passed on as they are.
    trainer = commands.add_parser("trainer", help="run a trainer process (python -m trainer)", add_help=False)
    trainer.set_defaults(func=cmd_trainer, passes_on=True)
    worker = commands.add_parser("worker", help="run a Celery rollout worker process (python -m workers)",
                                 add_help=False)
    worker.set_defaults(func=cmd_worker, passes_on=True)
    export_worker = commands.add_parser(
        "export-worker", help="run the Celery worker of checkpoint exports (python -m trainer.export_worker)",
        add_help=False)
    export_worker.set_defaults(func=cmd_export_worker, passes_on=True)
    inference_server = commands.add_parser(
        "inference-server", help="run a vLLM server with the flags remote generation needs (python -m "
        "workers.inference_server; `make vllm` first)", add_help=False)
    inference_server.set_defaults(func=cmd_inference_server, passes_on=True)

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
    model_import.add_argument(
        "--chat-template", metavar="FILE", default=None,
        help="a Jinja chat template for a model whose tokenizer has none (a base model such as Gemma 3 "
        "270M: policy/chat_templates/gemma3.jinja is Gemma's turn format); replaces any it has")
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
    parser = build_parser()
    args, passed_on = parser.parse_known_args(argv)
    if passed_on and not getattr(args, "passes_on", False):
        parser.error(f"unrecognized arguments: {' '.join(passed_on)}")
    args.passed_on = passed_on
    return args.func(args)


if __name__ == "__main__":
    sys.exit(main())
