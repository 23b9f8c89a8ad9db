"""jax.profiler traces of the next N steps, with the real profiler on CPU."""

import zipfile

import jax
import jax.numpy as jnp

from tandem.contracts import TraceRequest
from trainer.tracing import CapturedTrace, TraceCapture


@jax.jit
def _step(x):
    return jnp.tanh(x @ x.T).sum()


def _train(capture: TraceCapture, steps: range) -> None:
    x = jnp.ones((64, 64))
    for step in steps:
        capture.before_step(step)
        jax.block_until_ready(_step(x))
        capture.after_step(step)


def test_the_next_n_steps_are_traced_and_uploaded_as_a_zip_xprof_opens(tmp_path):
    uploaded: list[tuple[CapturedTrace, list[str]]] = []

    def upload(captured: CapturedTrace) -> None:
        with zipfile.ZipFile(captured.archive) as archive:
            uploaded.append((captured, archive.namelist()))

    capture = TraceCapture(upload, work_dir=tmp_path)
    _train(capture, range(1, 3))
    capture.request([TraceRequest(id=7, steps=2)])
    _train(capture, range(3, 7))

    ((captured, names),) = uploaded
    assert (captured.request.id, captured.first_step, captured.last_step, captured.error) == (7, 3, 4, "")
    # jax.profiler's own layout: what TensorBoard's profile plugin (XProf) and Perfetto read.
    assert any(name.startswith("plugins/profile/") and name.endswith(".xplane.pb") for name in names), names
    assert any(name.endswith(".trace.json.gz") for name in names), names
    assert not captured.archive.exists() and list(tmp_path.iterdir()) == []  # nothing left behind
    assert not capture.active


def test_a_request_is_handled_once_even_when_the_platform_repeats_it(tmp_path):
    uploaded: list[CapturedTrace] = []
    capture = TraceCapture(uploaded.append, work_dir=tmp_path)
    request = TraceRequest(id=1, steps=1)

    for step in range(1, 4):
        capture.request([request])  # until the upload lands, every telemetry reply lists it
        _train(capture, range(step, step + 1))

    assert [(c.request.id, c.first_step) for c in uploaded] == [(1, 1)]


def test_requests_are_traced_one_after_another_and_a_run_that_ends_uploads_what_it_has(tmp_path):
    uploaded: list[CapturedTrace] = []
    capture = TraceCapture(uploaded.append, work_dir=tmp_path)
    capture.request([TraceRequest(id=1, steps=1), TraceRequest(id=2, steps=5)])

    _train(capture, range(1, 4))
    capture.close(3)

    assert [(c.request.id, c.first_step, c.last_step, c.error) for c in uploaded] == [(1, 1, 1, ""), (2, 2, 3, "")]


def test_a_trace_that_cannot_start_is_reported_failed_and_training_goes_on(tmp_path):
    uploaded: list[CapturedTrace] = []
    capture = TraceCapture(uploaded.append, work_dir=tmp_path)
    jax.profiler.start_trace(str(tmp_path / "someone-elses"))  # only one profiler session at a time
    try:
        capture.request([TraceRequest(id=4, steps=2)])
        _train(capture, range(1, 3))
    finally:
        jax.profiler.stop_trace()

    ((captured,),) = [uploaded]
    assert captured.archive is None and captured.error.startswith("start_trace failed")
