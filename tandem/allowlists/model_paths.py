"""Where a run config's model files may be read from: the operator's model roots.

``model.hf_checkpoint`` and ``model.tokenizer`` are directories that the
trainer and every producer read. Unconfined, any member could point them at
any directory those hosts can read, another project's exported checkpoint
included. So they must lie under a root the operator lists in
``TANDEM_MODEL_ROOTS`` (comma separated; default ``<repo>/var/models``, where
``tandem models import`` and ``make models`` put models), after resolving
symbolic links, and never under the trainer's checkpoint root
(``TANDEM_CHECKPOINT_ROOT``, default ``<repo>/var/checkpoints``). A path with
a ``..`` component is refused as written.

The platform checks a config when it is written (a 400 naming the field); the
trainer and producers check again where the files are, before reading them,
since only there do the symbolic links resolve to what will be read.
"""

from __future__ import annotations

import os
from collections.abc import Iterable
from pathlib import Path, PurePath

REPO_ROOT = Path(__file__).resolve().parents[2]
MODEL_ROOTS_SETTING = "TANDEM_MODEL_ROOTS"
CHECKPOINT_ROOT_SETTING = "TANDEM_CHECKPOINT_ROOT"
DEFAULT_MODEL_ROOT = REPO_ROOT / "var" / "models"
DEFAULT_CHECKPOINT_ROOT = REPO_ROOT / "var" / "checkpoints"
#: The run config's fields that name model directories, and the value that names none.
MODEL_PATH_FIELDS = ("hf_checkpoint", "tokenizer")
_NOT_A_PATH = {"tokenizer": "byte"}


class ModelPathRefused(ValueError):
    """The path lies outside the operator's model roots, or inside the checkpoint root."""


def model_roots(configured: str | None = None) -> tuple[Path, ...]:
    """The operator's model roots (``TANDEM_MODEL_ROOTS``, else the default), resolved."""
    if configured is None:
        configured = os.environ.get(MODEL_ROOTS_SETTING, "")
    roots = [part.strip() for part in configured.split(",") if part.strip()]
    return tuple(Path(os.path.realpath(root)) for root in roots or [str(DEFAULT_MODEL_ROOT)])


def checkpoint_root(configured: str | None = None) -> Path:
    if configured is None:
        configured = os.environ.get(CHECKPOINT_ROOT_SETTING, "")
    return Path(os.path.realpath(configured.strip() or DEFAULT_CHECKPOINT_ROOT))


def _within(path: Path, root: Path) -> bool:
    return path == root or root in path.parents


def check_model_path(path: str, *, roots: Iterable[Path] | None = None,
                     refused_root: Path | None = None, roots_setting: str = MODEL_ROOTS_SETTING,
                     roots_name: str = "model roots") -> Path:
    """``path`` resolved, if it lies under one of ``roots`` and not under ``refused_root``.

    ``roots_setting`` and ``roots_name``: how a refusal names the roots (another kind of
    file the operator confines, such as SFT datasets, names its own).

    Raises:
      ModelPathRefused: it does not; the message names the setting that would allow it.
    """
    roots = tuple(model_roots() if roots is None else roots)
    refused_root = checkpoint_root() if refused_root is None else refused_root
    if ".." in PurePath(path).parts:
        raise ModelPathRefused(f"{path!r} has a '..' component")
    resolved = Path(os.path.realpath(path))
    if _within(resolved, refused_root):
        raise ModelPathRefused(f"{path!r} lies in the checkpoint root {refused_root}")
    if not any(_within(resolved, root) for root in roots):
        raise ModelPathRefused(
            f"{path!r} (resolved: {resolved}) is under none of the {roots_name} in "
            f"{roots_setting}: {', '.join(map(str, roots))}"
        )
    return resolved


def check_model_config_paths(model: object, *, roots: Iterable[Path] | None = None,
                             refused_root: Path | None = None) -> None:
    """Check every model directory a run's ``model`` config (a ModelConfig or its dict) names.

    Raises:
      ModelPathRefused: with the field's name first (``hf_checkpoint: ...``).
    """
    for field in MODEL_PATH_FIELDS:
        value = model.get(field) if isinstance(model, dict) else getattr(model, field)
        if not value or value == _NOT_A_PATH.get(field):
            continue
        try:
            check_model_path(value, roots=roots, refused_root=refused_root)
        except ModelPathRefused as exc:
            raise ModelPathRefused(f"{field}: {exc}") from None
