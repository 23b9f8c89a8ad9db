"""Orbax checkpoints of a run: train state plus the progress that goes with it.

A checkpoint is everything a resumed trainer needs to continue as if it had
never stopped: parameters (frozen base and adapters alike), optimizer state
and step in the train state, and a :class:`RunProgress` JSON with the policy
version and the stream position. Step ``n`` holds the state *after* ``n``
updates, so training resumes with the batch of step ``n``; batches keyed by
step (:func:`step_rng`) make that batch the one an uninterrupted run would
have seen.

Saving is asynchronous. :meth:`RunCheckpointer.save` blocks only while Orbax
copies the arrays to host memory (all of them: with Orbax's default options
every array is a "prioritized" transfer that ``save`` waits for); writing to
disk and the atomic commit (a rename of the step directory) happen in a
background thread. So the caller may donate the saved state to the next step
as soon as ``save`` returns. On CPU the host copy is a view of the device
buffer, and XLA then declines to reuse that buffer for a donated output (it
allocates a new one), so a donated step cannot overwrite what is being
written either; tests/trainer/test_checkpoints.py checks this.

A killed trainer leaves at most an uncommitted temporary directory, which
Orbax ignores: :meth:`RunCheckpointer.restore_latest` returns the newest
committed step.
"""

from __future__ import annotations

import json
import random
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import jax
import orbax.checkpoint as ocp
from pydantic import BaseModel, ConfigDict, Field, model_validator

from tandem.contracts import CheckpointInfo


class RunProgress(BaseModel):
    """Where a run stands besides its train state; saved as JSON next to it."""

    model_config = ConfigDict(extra="forbid")

    step: int = Field(description="Updates applied; equals the train state's step.")
    policy_version: int = Field(-1, description="Newest policy version published (-1: none yet).")
    run_id: int | None = Field(None, description="Run the checkpoint belongs to.")
    last_acked_entry_id: str | None = Field(
        None, description="Newest trajectory stream entry id acknowledged after its update."
    )
    trained_group_ids: list[str] = Field(
        default_factory=list,
        description="Episode groups already trained on; a resumed reader skips their entries.",
    )
    trained_group_count: int = Field(
        0, description="Number of groups trained on; at least len(trained_group_ids), kept if those are trimmed."
    )
    rl_steps: int = Field(0, description="RL updates among ``step`` (the rest were SFT).")
    has_reference: bool = Field(
        False, description="The checkpoint also holds the frozen reference policy of a KL penalty."
    )

    @model_validator(mode="after")
    def _count_covers_ids(self):
        self.trained_group_count = max(self.trained_group_count, len(self.trained_group_ids))
        return self


def step_rng(seed: int, step: int) -> random.Random:
    """The RNG of the batch of ``step``: the same for a resumed run as for an uninterrupted one."""
    return random.Random(f"{seed}:{step}")


def _abstract(tree: Any) -> Any:
    """ShapeDtypeStructs (with shardings) of arrays or ShapeDtypeStructs.

    A leaf without a sharding (e.g. from ``jax.eval_shape``) is restored onto
    the first device.
    """

    def abstract(leaf):
        sharding = getattr(leaf, "sharding", None)
        if sharding is None:
            sharding = jax.sharding.SingleDeviceSharding(jax.devices()[0])
        return jax.ShapeDtypeStruct(leaf.shape, leaf.dtype, sharding=sharding)

    return jax.tree.map(abstract, tree)


class RunCheckpointer:
    """Saves asynchronously, so the step loop does not wait for disk."""

    def __init__(self, directory: Path, *, max_to_keep: int | None = 3, read_only: bool = False):
        """``read_only``: another run's checkpoints, to restore from and never to change."""
        if not read_only:
            directory.mkdir(parents=True, exist_ok=True)
        self.directory = directory
        self._manager = ocp.CheckpointManager(
            directory.resolve(),
            options=ocp.CheckpointManagerOptions(max_to_keep=None if read_only else max_to_keep,
                                                 create=not read_only, read_only=read_only),
        )
        # Seconds the most recent save blocked the caller.
        self.last_save_blocking_s = 0.0
        # Newest step known committed while a later save is still being written.
        self._committed_floor: int | None = self._manager.latest_step()

    def save(self, step: int, *, train_state, progress: RunProgress | Mapping[str, Any],
             reference_params=None) -> float:
        """Start saving ``train_state`` and ``progress`` as ``step``; returns the seconds it blocked.

        Returns once the arrays are on the host: ``train_state`` may be
        donated right away. If the previous save is still being written, this
        waits for it first (Orbax keeps one save in flight), so saving more
        often than a save takes slows the loop down.
        """
        if not isinstance(progress, RunProgress):
            progress = RunProgress.model_validate(dict(progress))
        progress = progress.model_copy(update={"has_reference": reference_params is not None})
        items = {
            "train_state": ocp.args.StandardSave(train_state),
            "progress": ocp.args.JsonSave(progress.model_dump(mode="json")),
        }
        if reference_params is not None:
            items["reference"] = ocp.args.StandardSave(reference_params)
        started = time.perf_counter()
        previous = self._manager.latest_step()
        # Orbax finishes the previous save before it starts this one.
        self._manager.save(step, args=ocp.args.Composite(**items))
        self._committed_floor = previous
        self.last_save_blocking_s = time.perf_counter() - started
        return self.last_save_blocking_s

    def committed_step(self) -> int | None:
        """The newest step whose checkpoint is complete on disk (a crash now would resume from it)."""
        if self._manager.is_saving_in_progress():
            return self._committed_floor
        return self._manager.latest_step()

    def wait_until_finished(self) -> None:
        """Block until every started save is committed on disk."""
        self._manager.wait_until_finished()

    def latest_step(self) -> int | None:
        return self._manager.latest_step()

    def step_directory(self, step: int) -> Path:
        return self.directory.resolve() / str(step)

    def committed_checkpoints(self) -> list[CheckpointInfo]:
        """The committed checkpoints on disk, oldest first: what retention (``max_to_keep``) left.

        A save still being written is left out, so the platform never offers
        a checkpoint a crash could lose.
        """
        committed = self.committed_step()
        if committed is None:
            return []
        checkpoints = []
        for step in sorted(self._manager.all_steps()):
            # A step deleted through the platform is gone from disk though Orbax still lists it.
            if step > committed or not self.step_directory(step).is_dir():
                continue
            directory = self.step_directory(step)
            try:
                # The JSON item as Orbax wrote it: read directly, so a save in flight is never disturbed.
                progress = json.loads((directory / "progress" / "metadata").read_text())
                size = sum(path.stat().st_size for path in directory.rglob("*") if path.is_file())
            except FileNotFoundError:
                continue  # deleted meanwhile (through the platform)
            checkpoints.append(CheckpointInfo(step=step, policy_version=progress["policy_version"],
                                              path=str(directory), size_bytes=size))
        return checkpoints

    def restore(self, step: int, *, abstract_train_state) -> tuple[Any, RunProgress]:
        """Train state and progress of ``step``.

        ``abstract_train_state`` gives structure, dtypes and shardings: a
        freshly built train state, or its ``ShapeDtypeStruct``s.
        """
        restored = self._manager.restore(
            step,
            args=ocp.args.Composite(
                train_state=ocp.args.StandardRestore(_abstract(abstract_train_state)),
                progress=ocp.args.JsonRestore(),
            ),
        )
        return restored.train_state, RunProgress.model_validate(restored.progress)

    def restore_reference(self, step: int, *, abstract_params) -> Any:
        """The reference policy saved with ``step`` (its progress has ``has_reference``)."""
        restored = self._manager.restore(
            step, args=ocp.args.Composite(reference=ocp.args.StandardRestore(_abstract(abstract_params)))
        )
        return restored.reference

    def restore_latest(self, abstract_train_state) -> tuple[Any, RunProgress] | None:
        """The newest committed checkpoint, or None if there is none."""
        step = self.latest_step()
        if step is None:
            return None
        return self.restore(step, abstract_train_state=abstract_train_state)

    def close(self) -> None:
        self._manager.wait_until_finished()
        self._manager.close()
