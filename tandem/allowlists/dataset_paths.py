"""Where a dataset may be registered from by path: the operator's dataset roots.

``tandem datasets register --path`` (and the API's ``path``) make the platform
read a JSONL file on its own host. Unconfined, any member could have it read
any file the platform can (its settings, another project's checkpoints), so
the file must lie under a root the operator lists in ``TANDEM_DATASET_ROOTS``
(comma separated; default ``<repo>/var/datasets``), after resolving symbolic
links, and never under the checkpoint root; a ``..`` component is refused as
written. The rule is the model roots' (tandem/allowlists/model_paths.py), with roots of its own.
"""

from __future__ import annotations

import os
from collections.abc import Iterable
from pathlib import Path

from tandem.allowlists.model_paths import REPO_ROOT, ModelPathRefused, check_model_path

DATASET_ROOTS_SETTING = "TANDEM_DATASET_ROOTS"
DEFAULT_DATASET_ROOT = REPO_ROOT / "var" / "datasets"


class DatasetPathRefused(ValueError):
    """The path lies outside the operator's dataset roots, or inside the checkpoint root."""


def dataset_roots(configured: str | None = None) -> tuple[Path, ...]:
    """The operator's dataset roots (``TANDEM_DATASET_ROOTS``, else the default), resolved."""
    if configured is None:
        configured = os.environ.get(DATASET_ROOTS_SETTING, "")
    roots = [part.strip() for part in configured.split(",") if part.strip()]
    return tuple(Path(os.path.realpath(root)) for root in roots or [str(DEFAULT_DATASET_ROOT)])


def check_dataset_path(path: str, *, roots: Iterable[Path], refused_root: Path) -> Path:
    """``path`` resolved, if it is a file under one of ``roots`` and not under ``refused_root``.

    Raises:
      DatasetPathRefused: it is not; the message names the setting that would allow it.
    """
    try:
        resolved = check_model_path(path, roots=roots, refused_root=refused_root,
                                    roots_setting=DATASET_ROOTS_SETTING, roots_name="dataset roots")
    except ModelPathRefused as error:
        raise DatasetPathRefused(str(error)) from None
    if not resolved.is_file():
        raise DatasetPathRefused(f"{path!r} is not a file")
    return resolved
