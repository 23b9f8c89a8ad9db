"""``python -m trainer``: a trainer process (what ``tandem trainer`` runs), claiming queued runs and training them."""

from __future__ import annotations

import argparse
import logging
import os
import sys
from pathlib import Path

from tandem.runtime.process_start import DEFAULT_REDIS_URL, redis_url, stop_on_sigterm


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="tandem trainer", description="run a trainer process")
    parser.add_argument("--redis-url", help=f"default: $REDIS_URL or {DEFAULT_REDIS_URL}")
    parser.add_argument("--platform-url", default=os.environ.get("TANDEM_PLATFORM_URL", "http://127.0.0.1:8000"))
    parser.add_argument("--token", help="a trainer's API token (tandem-trainers group); default $TANDEM_TRAINER_TOKEN")
    parser.add_argument("--checkpoint-dir", default=os.environ.get("TANDEM_CHECKPOINT_ROOT")
                        or os.environ.get("TANDEM_CHECKPOINT_DIR", "var/checkpoints"),
                        help="the checkpoint root; default $TANDEM_CHECKPOINT_ROOT (the platform's too)")
    parser.add_argument("--max-runs", type=int, help="exit after training this many runs")
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    token = args.token or os.environ.get("TANDEM_TRAINER_TOKEN")
    if not token:
        print("tandem trainer: pass --token or set TANDEM_TRAINER_TOKEN (the API token of a user in the "
              "tandem-trainers group)", file=sys.stderr)
        return 2
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(levelname)s %(message)s")
    # One line per HTTP request would bury the trainer's log.
    logging.getLogger("httpx").setLevel(logging.WARNING)
    from trainer.main import LostProcessError, exit_for_restart, serve

    stop_on_sigterm()
    try:
        serve(platform_url=args.platform_url, token=token, redis_url=redis_url(args.redis_url),
              checkpoint_root=Path(args.checkpoint_dir), max_runs=args.max_runs)
    except KeyboardInterrupt:
        logging.getLogger("tandem.trainer").info("trainer stopped")
    except LostProcessError as exc:
        exit_for_restart(exc)  # its run is queued again; every process of the job must start again
    return 0


if __name__ == "__main__":
    sys.exit(main())
