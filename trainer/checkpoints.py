"""Orbax checkpoints of a run: train state plus the progress that goes with it."""

from __future__ import annotations

from pathlib import Path

import orbax.checkpoint as ocp


class RunCheckpointer:
    """Saves asynchronously (Orbax's default), so the step loop does not wait for disk."""

    def __init__(self, directory: Path, *, max_to_keep: int = 3):
        directory.mkdir(parents=True, exist_ok=True)
        self.directory = directory
        self._manager = ocp.CheckpointManager(
            directory.resolve(),
            options=ocp.CheckpointManagerOptions(max_to_keep=max_to_keep, create=True),
        )

    def save(self, step: int, *, train_state, progress: dict) -> None:
        self._manager.save(
            step,
            args=ocp.args.Composite(
                train_state=ocp.args.StandardSave(train_state),
                progress=ocp.args.JsonSave(progress),
            ),
        )

    def latest_step(self) -> int | None:
        return self._manager.latest_step()

    def restore(self, step: int, *, abstract_train_state):
        restored = self._manager.restore(
            step,
            args=ocp.args.Composite(
                train_state=ocp.args.StandardRestore(abstract_train_state),
                progress=ocp.args.JsonRestore(),
            ),
        )
        return restored.train_state, restored.progress

    def close(self) -> None:
        self._manager.wait_until_finished()
        self._manager.close()
