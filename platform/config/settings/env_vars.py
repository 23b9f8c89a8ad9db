"""Reading settings from environment variables, in one place.

Also the paths and the Redis URL that several settings modules share.
"""

import os
from pathlib import Path

PLATFORM_DIR = Path(__file__).resolve().parents[2]
REPO_ROOT = PLATFORM_DIR.parent


def env_str(name: str, default: str) -> str:
    return os.environ.get(name, default)


def env_bool(name: str, default: bool) -> bool:
    value = os.environ.get(name)
    if value is None:
        return default
    return value.strip().lower() in {"1", "true", "yes", "on"}


def env_list(name: str, default: list[str]) -> list[str]:
    value = os.environ.get(name)
    if value is None:
        return default
    return [item.strip() for item in value.split(",") if item.strip()]


REDIS_URL = env_str("REDIS_URL", "redis://127.0.0.1:6379/0")


def env_float(name: str, default: float) -> float:
    value = os.environ.get(name)
    return default if value is None else float(value)
