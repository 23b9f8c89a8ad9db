"""The trainer process: claim queued runs from the platform and train them, one at a time."""

from __future__ import annotations

import logging
import os
import socket
import sys
import threading
import time
from pathlib import Path
from typing import NoReturn

import jax
from celery import Celery

from policy import enable_compilation_cache
from tandem.contracts import RETRY_AFTER_MAX_S, RunStatus, TrainerHeartbeat, task_routes
from tandem.runtime.process_reports import start_process_reporter, stop_process_reporter
from tandem.runtime.redis_clients import durable_redis, durable_task_publishing
from tandem.runtime.resource_usage import return_freed_memory
from tandem.runtime.run_logs import (
    process_run_log_scope,
    start_run_log_shipping,
    stop_run_log_shipping,
)
from trainer.devices import trainer_device
from trainer.follower import follow
from trainer.job_liveness import FollowerWatch, ProcessBeat, follower_lapse_s
from trainer.lockstep import (
    LOST_PROCESS_EXIT_CODE,
    SINGLE_PROCESS,
    Leader,
    Lockstep,
    LostProcessError,
)
from trainer.platform_client import (
    SERVER_ERROR_RETRIES,
    PlatformClient,
    RunTakenOverError,
    UnusableClaimError,
)
from trainer.run_loop import RunSetAsideError, RunTrainer, TrainerSettings
from trainer.sharding import distributed_heartbeat_timeout_s, initialize_distributed

logger = logging.getLogger("tandem.trainer")


def serve(*, platform_url: str, token: str, redis_url: str, checkpoint_root: Path,
          poll_s: float = 1.0, max_runs: int | None = None) -> int:
    """Claim and train runs until interrupted (or ``max_runs`` were trained); returns runs trained.

    In a multi-process trainer (docs/multi_host.md) only process 0 does this; the others follow
    it (trainer/follower.py) and return the runs they followed when it stops.

    Raises:
      LostProcessError: the JAX job lost a process (process 0 gave its run back to the queue
        first, as a restart); this process must end too (:func:`exit_for_restart`).
    """
    # Joins a multi-host JAX job when TANDEM_COORDINATOR_ADDRESS etc. are set; a no-op on one host.
    initialize_distributed()
    enable_compilation_cache()
    if jax.process_index() != 0:
        # Process 0 counts this one lost when these stop (trainer/job_liveness.py).
        beat = ProcessBeat(jax.process_index())
        beat.start()
        try:
            return follow(redis_url=redis_url)
        except jax.errors.JaxRuntimeError as exc:
            raise LostProcessError(f"process 0 of the trainer's JAX job is gone: {exc}") from exc
        finally:
            beat.stop()
    lockstep: Lockstep = Leader() if jax.process_count() > 1 else SINGLE_PROCESS
    consumer = f"{socket.gethostname()}:{os.getpid()}"
    # Retries for as long as it takes: at first boot the platform may still be migrating. A request
    # the platform fails with a 500 every time (a dataset version it cannot serve) fails after
    # SERVER_ERROR_RETRIES tries, or as many as TANDEM_TRAINER_SERVER_ERROR_RETRIES says; on a read of a
    # run's data, the run is set aside (RunSetAsideError) and, past its restarts, fails.
    platform = PlatformClient(platform_url, token, trainer_name=consumer,
                              server_error_retries=int(os.environ.get("TANDEM_TRAINER_SERVER_ERROR_RETRIES",
                                                                      SERVER_ERROR_RETRIES)))
    # A run whose data the platform kept failing is set aside this long, other runs trained meanwhile.
    set_aside_s = set_aside_seconds(os.environ.get("TANDEM_TRAINER_SET_ASIDE_S"))
    # Rides out a Redis restart: commands reconnect and run again (tandem/runtime/redis_clients.py).
    redis_client = durable_redis(redis_url)
    # A bare client: the trainer sends rollout tasks by name and never imports worker code.
    celery_app = Celery("tandem_trainer", broker=redis_url)
    # Its rollout, evaluation and demonstration requests wait out a Redis restart as its commands do.
    celery_app.conf.update(task_serializer="json", accept_content=["json"], task_routes=task_routes(),
                           **durable_task_publishing(redis_url))
    weight_dir = os.environ.get("TANDEM_WEIGHT_DIR")
    settings = TrainerSettings(redis_url=redis_url, checkpoint_root=checkpoint_root, consumer_name=consumer,
                               weight_dir=Path(weight_dir) if weight_dir else None)
    trained = 0
    # The run this trainer holds, for its process report (read from the reporter's thread).
    working_on: list[int] = []
    # Its device's memory is the limit the platform holds a new run's memory plan to, unless the
    # operator declares one (TANDEM_TRAINER_MEMORY_BYTES); its platform, how that plan counts logits.
    start_process_reporter(redis_url=redis_url, role="trainer", run_ids=lambda: list(working_on),
                           device=trainer_device())
    # What this process logs while it holds a run goes to the run's log too (tandem/runtime/run_logs.py).
    start_run_log_shipping(redis_url=redis_url, role="trainer")
    # A follower that dies in the middle of a collective can leave this process waiting in it for
    # good: the watch then gives the held run back and ends the process, as a failed collective does.
    give_back_once = _GiveBackOnce()
    follower_watch = None
    if lockstep.leading:
        def on_silent_follower(process_id: int, silent_s: float) -> None:
            lost = LostProcessError(f"lost a process of its JAX job (process {process_id} has not beaten for "
                                    f"{silent_s:.0f} s)")
            if working_on:
                # A client of its own: the main thread's may be in the middle of a request.
                reporter = PlatformClient(platform_url, token, trainer_name=consumer)
                try:
                    give_back_once(reporter, working_on[0], consumer, str(lost))
                finally:
                    reporter.close()
            exit_for_restart(lost)

        follower_watch = FollowerWatch(list(range(1, jax.process_count())), on_silent=on_silent_follower,
                                       lapse_s=follower_lapse_s(distributed_heartbeat_timeout_s()))
        follower_watch.start()
    logger.info("trainer %s waiting for runs at %s", consumer, platform_url)
    job_lost = False
    try:
        while max_runs is None or trained < max_runs:
            try:
                claimed = platform.claim(consumer)
            except UnusableClaimError as exc:
                with process_run_log_scope(exc.run_id):
                    logger.error("run %s cannot be trained: %s", exc.run_id, exc.reason)
                    _report_failure(platform, exc.run_id, consumer, f"trainer cannot train it: {exc.reason}")
                trained += 1
                continue
            if claimed is None:
                lockstep.keep_alive()
                time.sleep(poll_s)
                continue
            working_on[:] = [claimed.run_id]
            # Every thread of the trainer works for this run until it lets go: all of it is the run's log.
            with process_run_log_scope(claimed.run_id):
                logger.info("claimed run %s (%s)%s", claimed.run_id, claimed.name,
                            f", attempt {claimed.attempt}: resuming" if claimed.is_resume else "")
                liveness = LivenessBeat(platform_url=platform_url, token=token, run_id=claimed.run_id,
                                        worker=consumer, interval_s=settings.heartbeat_interval_s)
                liveness.start()
                try:
                    status = RunTrainer(claimed, settings=settings, platform=platform, redis_client=redis_client,
                                        celery_app=celery_app, lockstep=lockstep).run()
                    logger.info("run %s ended: %s", claimed.run_id, status)
                except RunTakenOverError as exc:
                    logger.warning("run %s: %s; this trainer stops working on it", claimed.run_id, exc)
                except RunSetAsideError as exc:
                    # Not this run's end: a restart, counted against its max_restarts, that no trainer
                    # claims for set_aside_s; this trainer claims the next run meanwhile.
                    logger.warning("run %s: %s; set aside for %g s", claimed.run_id, exc, set_aside_s)
                    _give_back(platform, claimed.run_id, consumer, f"set the run aside for {set_aside_s:g} s: {exc}",
                               retry_after_s=set_aside_s)
                except KeyboardInterrupt:
                    # Stopped by the operator: say so, rather than leave the run "running" forever.
                    # Promptly: a stack that stops takes its web server down too, and a supervisor
                    # gives a stopping process seconds; the reaper fails a run whose heartbeats end.
                    _report_failure(platform, claimed.run_id, consumer, "trainer process was stopped",
                                    retries=STOPPED_REPORT_RETRIES)
                    raise
                except Exception as exc:
                    if lockstep.breaks_job(exc):
                        # The job lost a process, the run nothing: it goes back to the queue as a
                        # restart (counted against max_restarts), to resume from its checkpoint once
                        # the supervisor has started every process again.
                        lost = LostProcessError(_lost_process_message(exc))
                        logger.exception("run %s: the trainer %s; giving the run back", claimed.run_id, lost)
                        give_back_once(platform, claimed.run_id, consumer, str(lost))
                        raise lost from exc
                    logger.exception("run %s failed", claimed.run_id)
                    _report_failure(platform, claimed.run_id, consumer, f"trainer error: {type(exc).__name__}: {exc}")
                finally:
                    liveness.stop()
                    working_on.clear()
                    # The run's model, optimizer state and compiled steps are garbage now: the
                    # process waits for the next run at its idle size, not at this run's peak.
                    return_freed_memory()
            trained += 1
    except LostProcessError:
        job_lost = True
        raise
    except Exception as exc:
        if not lockstep.breaks_job(exc):
            raise
        job_lost = True  # learnt between runs (a keep-alive's broadcast failed): no run to give back
        raise LostProcessError(_lost_process_message(exc)) from exc
    finally:
        if follower_watch is not None:
            follower_watch.stop()  # the followers stop beating once they are released
        try:
            if not job_lost:
                lockstep.quit()
        except Exception:  # noqa: BLE001 - the followers are gone already: nothing to release
            logger.warning("trainer processes following this one could not be told it stops", exc_info=True)
        stop_run_log_shipping()
        stop_process_reporter()
        platform.close()
        redis_client.close()
    return trained


class LivenessBeat(threading.Thread):
    """Heartbeats that only say "this trainer is alive", from a thread of their own.

    The training loop reports progress and learns of cancels and pauses at its
    own heartbeats, but building a large model, compiling or checkpointing can
    block it for longer than the reaper's timeout. This thread keeps the run
    from being reaped meanwhile; a dead process stops both.
    """

    def __init__(self, *, platform_url: str, token: str, run_id: int, worker: str, interval_s: float):
        super().__init__(name=f"liveness-run-{run_id}", daemon=True)
        self._client = PlatformClient(platform_url, token, trainer_name=worker, retries=0)
        self._run_id = run_id
        self._worker = worker
        self._interval_s = interval_s
        self._stopped = threading.Event()

    def run(self) -> None:
        try:
            while not self._stopped.wait(self._interval_s):
                try:
                    self._client.heartbeat(self._run_id, TrainerHeartbeat(status=None, worker=self._worker))
                except RunTakenOverError:
                    return
                except Exception as exc:  # the loop's own heartbeats report real trouble
                    logger.warning("liveness heartbeat of run %s failed: %s", self._run_id, exc)
        finally:
            self._client.close()

    def stop(self) -> None:
        self._stopped.set()
        self.join(timeout=self._interval_s + 10)


# How long a run whose data the platform kept failing is set aside (TANDEM_TRAINER_SET_ASIDE_S):
# long enough for another run to be claimed and trained, short enough that a passing fault costs
# the run a minute per restart.
SET_ASIDE_S = 60.0


def set_aside_seconds(setting: str | None) -> float:
    """TANDEM_TRAINER_SET_ASIDE_S as seconds (SET_ASIDE_S when unset); a clear error naming it otherwise."""
    if setting is None or not setting.strip():
        return SET_ASIDE_S
    try:
        seconds = float(setting)
    except ValueError:
        seconds = -1.0
    if not 0 <= seconds <= RETRY_AFTER_MAX_S:
        raise ValueError(f"TANDEM_TRAINER_SET_ASIDE_S={setting!r}: give seconds from 0 to {RETRY_AFTER_MAX_S:g}")
    return seconds


# A failure report is retried this often before the trainer gives up on it and goes on: the
# reaper then fails the run when its heartbeats stop.
FAILURE_REPORT_RETRIES = 8
# Of the report that the operator stopped the trainer: a second or so of tries.
STOPPED_REPORT_RETRIES = 2


# Of the reason a run given back carries: a collective's error text, without its traceback.
LOST_PROCESS_MESSAGE_CHARS = 500


def _lost_process_message(error: BaseException) -> str:
    return f"lost a process of its JAX job ({type(error).__name__}: {str(error)[:LOST_PROCESS_MESSAGE_CHARS]})"


class _GiveBackOnce:
    """The held run goes back to the queue once, by whichever thread learns first that the job lost a
    process (a failed collective, or the follower watch); the other waits for it before ending."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._given_back = False

    def __call__(self, platform: PlatformClient, run_id: int, worker: str, message: str) -> None:
        with self._lock:
            if not self._given_back:
                self._given_back = True
                _give_back(platform, run_id, worker, message)


def _give_back(platform: PlatformClient, run_id: int, worker: str, message: str, *,
               retry_after_s: float | None = None) -> None:
    """Queue the run again as a restart (heartbeat status queued), claimable after ``retry_after_s``;
    never raises. Should it not get through, the reaper restarts the run once this process's
    heartbeats end, which counts alike."""
    try:
        platform.heartbeat(run_id, TrainerHeartbeat(status=RunStatus.QUEUED, message=message, worker=worker,
                                                    retry_after_s=retry_after_s),
                           retries=FAILURE_REPORT_RETRIES)
    except RunTakenOverError:
        pass  # the reaper or a user got there first
    except Exception:
        logger.exception("run %s: giving it back to the queue failed; the reaper will restart it", run_id)


def exit_for_restart(error: LostProcessError) -> NoReturn:
    """End this trainer process at once with :data:`LOST_PROCESS_EXIT_CODE`, for its supervisor to start
    every process of the job again.

    Not through the interpreter's exit: there JAX waits at a shutdown barrier for every process of
    the job, which a lost one never reaches, until the job's heartbeat timeout aborts this process.
    """
    logger.error("%s: exiting with %d, for the supervisor to start every trainer process again", error,
                 LOST_PROCESS_EXIT_CODE)
    logging.shutdown()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(LOST_PROCESS_EXIT_CODE)


def _report_failure(platform: PlatformClient, run_id: int, worker: str, message: str, *,
                    retries: int = FAILURE_REPORT_RETRIES) -> None:
    """Tell the platform the run failed; never raises, so that the trainer goes on to the next run."""
    try:
        platform.heartbeat(run_id, TrainerHeartbeat(status=RunStatus.FAILED, message=message, worker=worker),
                           retries=retries)
    except RunTakenOverError:
        pass  # another trainer holds the run now, or none does: its failure is not ours to report
    except Exception:
        logger.exception("run %s: reporting its failure (%s) failed", run_id, message)
