"""`jax.profiler` traces of the trainer's next N steps, on a user's request through the platform.

The platform hands pending :class:`TraceRequest` s to the trainer in its reply
to each telemetry post; :class:`TraceCapture` traces the following steps and
uploads the trace directory, zipped, under the request's id. The zip holds
jax.profiler's own output (``plugins/profile/<run>/<host>.xplane.pb`` and
``.trace.json.gz``), which XProf/TensorBoard and Perfetto open as they are.
"""

from __future__ import annotations

import logging
import shutil
import tempfile
import zipfile
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import jax

from tandem.contracts import TraceRequest

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class CapturedTrace:
    request: TraceRequest
    first_step: int
    last_step: int
    archive: Path | None  # None when tracing failed; then ``error`` says why
    error: str = ""


class TraceCapture:
    """Traces one request at a time, in order; a request is handled once per process.

    ``upload`` receives each finished :class:`CapturedTrace` (its archive is
    deleted afterwards). A trainer that dies mid-trace leaves the request
    pending, so the trainer that resumes the run traces it again.
    """

    def __init__(self, upload: Callable[[CapturedTrace], None], *, work_dir: Path | None = None):
        self._upload = upload
        self._work_dir = work_dir
        self._pending: list[TraceRequest] = []
        self._seen: set[int] = set()
        self._active: TraceRequest | None = None
        self._trace_dir: Path | None = None
        self._steps_left = 0
        self._first_step = 0

    @property
    def active(self) -> bool:
        return self._active is not None

    def request(self, requests: list[TraceRequest]) -> None:
        for request in requests:
            if request.id not in self._seen:
                self._seen.add(request.id)
                self._pending.append(request)

    def before_step(self, step: int) -> None:
        """Start tracing if a request waits and none is running; ``step`` is the next step's number."""
        if self._active is not None or not self._pending:
            return
        request = self._pending.pop(0)
        self._trace_dir = Path(tempfile.mkdtemp(prefix=f"tandem-trace-{request.id}-", dir=self._work_dir))
        try:
            jax.profiler.start_trace(str(self._trace_dir))
        except Exception as exc:  # noqa: BLE001 - e.g. another profiler session is running
            logger.warning("trace %s could not start: %s", request.id, exc)
            self._finish(CapturedTrace(request, step, step, None, f"start_trace failed: {exc}"))
            return
        self._active, self._steps_left, self._first_step = request, request.steps, step

    def after_step(self, step: int) -> None:
        """Count a traced step (``step``: its number); the last one stops the trace and uploads it."""
        if self._active is None:
            return
        self._steps_left -= 1
        if self._steps_left > 0:
            return
        request, self._active = self._active, None
        try:
            jax.profiler.stop_trace()
            archive = self._zip(request)
        except Exception as exc:  # noqa: BLE001 - a failed trace must never fail the run
            logger.warning("trace %s failed: %s", request.id, exc)
            self._finish(CapturedTrace(request, self._first_step, step, None, f"stop_trace failed: {exc}"))
            return
        self._finish(CapturedTrace(request, self._first_step, step, archive))

    def close(self, step: int) -> None:
        """The run ends: stop and upload a trace still running (fewer steps than asked)."""
        if self._active is not None:
            self._steps_left = 1
            self.after_step(step)

    def _zip(self, request: TraceRequest) -> Path:
        assert self._trace_dir is not None
        files = sorted(path for path in self._trace_dir.rglob("*") if path.is_file())
        if not files:
            raise RuntimeError("jax.profiler wrote no files")
        archive = self._trace_dir.with_suffix(".zip")
        with zipfile.ZipFile(archive, "w", compression=zipfile.ZIP_DEFLATED) as zipped:
            for path in files:
                zipped.write(path, path.relative_to(self._trace_dir).as_posix())
        return archive

    def _finish(self, captured: CapturedTrace) -> None:
        try:
            self._upload(captured)
        except Exception as exc:  # noqa: BLE001 - the request stays pending on the platform
            logger.warning("uploading trace %s failed: %s", captured.request.id, exc)
        finally:
            if captured.archive is not None:
                captured.archive.unlink(missing_ok=True)
            if self._trace_dir is not None:
                shutil.rmtree(self._trace_dir, ignore_errors=True)
                self._trace_dir = None
