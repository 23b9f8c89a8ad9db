#!/usr/bin/env python
"""Django's command-line entry point for the Tandem platform."""

import os
import sys
from pathlib import Path

PLATFORM_DIR = Path(__file__).resolve().parent
REPO_ROOT = PLATFORM_DIR.parent


def main() -> None:
    # The Django apps are top-level modules in this folder, and they import the
    # shared contracts from the `tandem` package at the repository root.
    for path in (str(REPO_ROOT), str(PLATFORM_DIR)):
        if path not in sys.path:
            sys.path.insert(0, path)
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "config.settings.dev")
    from django.core.management import execute_from_command_line

    execute_from_command_line(sys.argv)


if __name__ == "__main__":
    main()
