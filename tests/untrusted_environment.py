"""A module that does something the moment it is imported, outside the test allow-list.

The security tests name it in environment registrations: it must be refused
before it is imported, so the marker file it would write never appears.
"""

import os
from pathlib import Path

_marker = os.environ.get("TANDEM_TEST_IMPORT_MARKER")
if _marker:
    Path(_marker).write_text("imported")


class UntrustedEnvironment:
    def sample_task(self, rng):
        return {}

    async def reset(self, task):
        return "hello"

    async def step(self, action):
        return "", 0.0, True, {}
