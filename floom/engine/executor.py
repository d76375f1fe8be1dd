"""The executor: claims queued runs, runs them in the sandbox, streams logs, keeps leases."""

from __future__ import annotations

import json
import logging
import mimetypes
import shutil
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from datetime import datetime
from pathlib import Path
from typing import TYPE_CHECKING, Any

from floom.engine.cleanup import discard_later
from floom.engine.phases import execute_phased, is_phased
from floom.engine.queue import (
    Outcome,
    claim_next_run,
    finish_attempt,
    reap_expired_leases,
    renew_leases,
)
from floom.engine.script import redact_outcome, script_spec
from floom.manifest import Manifest
from floom.sandbox.base import Sandbox, SandboxResult
from floom.services import secrets as secret_service
from floom.services import workers
from floom.services.logs import append_events, system_event
from floom.services.runs import CANCELLED, FAILED, QUEUED, RUNNING, SUCCEEDED, TIMED_OUT
from floom.services.secrets import Redactor
from floom.store.db import session_scope
from floom.store.models import Run, Version, utcnow

if TYPE_CHECKING:
    from floom.services.context import Context

log = logging.getLogger("floom.executor")

MAX_LINE = 16 * 1024
LOG_FLUSH_SECONDS = 0.1


class RunLog:
    """Buffers a run's lines (redacted on arrival) until the flusher writes them."""

    def __init__(self, *, run_id: str, attempt: int, redactor: Redactor, max_lines: int) -> None:
        self.run_id = run_id
        self.attempt = attempt
        self._redactor = redactor
        self._pending: list[tuple[str, str, datetime | None]] = []
        self._lock = threading.Lock()
        self._flush_lock = threading.Lock()
        self._count = 0
        self._max = max_lines
        self.last_stderr = ""

    def redact_with(self, redactor: Redactor) -> None:
        """Known once the run's secrets are resolved; no line has arrived before that."""
        self._redactor = redactor

    def add(self, stream: str, line: str) -> None:
        line = self._redactor.text(line[:MAX_LINE])
        with self._lock:
            self._count += 1
            if self._count > self._max:
                if self._count == self._max + 1:
                    self._pending.append(
                        ("system", f"log limit of {self._max} lines reached; dropping", utcnow())
                    )
                return
            self._pending.append((stream, line, utcnow()))
            if stream == "stderr" and line.strip():
                self.last_stderr = line

    def drain(self) -> list[tuple[str, str, datetime | None]]:
        """Take every pending line, after any flush in progress has been written, so the
        caller can store them in the same transaction as the run's end."""
        with self._flush_lock, self._lock:
            batch, self._pending = self._pending, []
        return batch

    def flush(self, ctx: Context) -> None:
        # One flush at a time per run: the flusher thread and the run's own final flush
        # must not interleave, or lines could land after the run's closing event.
        with self._flush_lock:
            with self._lock:
                batch, self._pending = self._pending, []
            if batch:
                with session_scope(ctx.engine, write=True) as s:
                    append_events(s, run_id=self.run_id, attempt=self.attempt, lines=batch)


class Executor:
    """Runs queued runs on this node, up to `executor_slots` at a time."""

    def __init__(self, ctx: Context, sandbox: Sandbox) -> None:
        self.ctx = ctx
        self.sandbox = sandbox
        self.slots = max(1, ctx.settings.executor_slots)
        self._pool = ThreadPoolExecutor(self.slots, thread_name_prefix="floom-run")
        self._stop = threading.Event()
        self._active: dict[str, RunLog] = {}
        self._active_lock = threading.Lock()
        self._cancel: set[str] = set()
        self._interrupted: set[str] = set()
        self._threads: list[threading.Thread] = []

    # lifecycle

    def start(self) -> None:
        # Work dirs left by a killed process belong to runs the reaper requeues below.
        orphans = self.sandbox.kill_orphans(self.ctx.settings.work_root)
        if orphans:
            log.warning("killed %d sandbox(es) a previous process left running", orphans)
        shutil.rmtree(self.ctx.settings.work_root, ignore_errors=True)
        reaped = reap_expired_leases(self.ctx, own_node_restart=True)
        if reaped:
            log.warning("requeued or failed %d run(s) abandoned by a previous process", reaped)
        for target, name in (
            (self._dispatch_loop, "floom-dispatch"),
            (self._heartbeat_loop, "floom-heartbeat"),
            (self._flush_loop, "floom-logs"),
            (self._reap_loop, "floom-reaper"),
        ):
            t = threading.Thread(target=target, name=name, daemon=True)
            t.start()
            self._threads.append(t)

    def stop(self, *, grace_seconds: float = 10.0) -> None:
        """Stop claiming; give running attempts `grace_seconds`, then kill and requeue them."""
        self._stop.set()
        self.ctx.run_queued.set()
        deadline = time.monotonic() + grace_seconds
        while self.active_count() and time.monotonic() < deadline:
            time.sleep(0.05)
        with self._active_lock:
            self._interrupted.update(self._active)
        self._pool.shutdown(wait=True)
        for t in self._threads:
            t.join(timeout=5)
        self._flush_all()

    def active_count(self) -> int:
        with self._active_lock:
            return len(self._active)

    # loops

    def _dispatch_loop(self) -> None:
        busy = False  # the last claim found a run: the queue is likely not empty
        while not self._stop.is_set():
            try:
                if self.active_count() >= self.slots:
                    # Full: sleep until an attempt ends (it sets the event), not in a spin.
                    self.ctx.run_queued.clear()
                    if self.active_count() >= self.slots:
                        self.ctx.run_queued.wait(self.ctx.settings.poll_interval_seconds)
                    continue
                self.ctx.run_queued.clear()
                run = claim_next_run(self.ctx, look_first=not busy)
                busy = run is not None
                if run is not None:
                    self._launch(run)
                    continue
                self.ctx.run_queued.wait(self.ctx.settings.poll_interval_seconds)
            except Exception:  # the loop must survive a database hiccup; it retries
                log.exception("dispatch failed; retrying")
                self._stop.wait(1.0)

    def _heartbeat_loop(self) -> None:
        while not self._stop.wait(self.ctx.settings.heartbeat_seconds):
            with self._active_lock:
                seen = dict(self._active)
            try:
                cancel, lost = renew_leases(self.ctx, list(seen))
            except Exception:  # a missed heartbeat is survivable; the lease has slack
                log.exception("heartbeat failed")
                continue
            with self._active_lock:
                # Only the attempts this heartbeat looked at: a run that paused for approval
                # may already run again here as a new attempt, which must not inherit this.
                self._cancel.update(r for r in cancel | lost if self._active.get(r) is seen[r])

    def _flush_loop(self) -> None:
        while not self._stop.wait(LOG_FLUSH_SECONDS):
            self._flush_all()

    def _flush_all(self) -> None:
        with self._active_lock:
            logs = list(self._active.values())
        for run_log in logs:
            try:
                run_log.flush(self.ctx)
            except Exception:  # lines stay buffered only until the run's final flush
                log.exception("log flush failed for %s", run_log.run_id)

    def _reap_loop(self) -> None:
        while not self._stop.wait(self.ctx.settings.reap_interval_seconds):
            try:
                reap_expired_leases(self.ctx)
            except Exception:  # the next pass retries
                log.exception("reaper failed")

    # one attempt

    def _launch(self, run: Run) -> None:
        run_log = RunLog(
            run_id=run.id,
            attempt=run.attempt,
            redactor=Redactor([]),
            max_lines=self.ctx.settings.max_log_lines_per_run,
        )
        with self._active_lock:
            self._active[run.id] = run_log
            self._cancel.discard(run.id)
        self._pool.submit(self._run_attempt, run, run_log)

    def _should_cancel(self, run_id: str) -> bool:
        return (
            run_id in self._cancel
            or run_id in self.ctx.local_cancels
            or run_id in self._interrupted
        )

    def _run_attempt(self, run: Run, run_log: RunLog) -> None:
        started = time.monotonic()
        try:
            version = workers.get_version(self.ctx, version_id=run.version_id)
            manifest = workers.manifest_of(version)
            outcome = self._execute(run, version, manifest, run_log)
            backoff = float(manifest.retries.backoff_seconds)
            exponential = manifest.retries.backoff != "fixed"
        except Exception as exc:  # an attempt must always end in a recorded state
            log.exception("run %s crashed in the executor", run.id)
            outcome = Outcome(
                status=FAILED,
                error_code="executor_error",
                error_message=f"floom could not run this attempt: {type(exc).__name__}",
                retryable=True,
            )
            backoff, exponential = 5.0, True
        outcome.sandbox_seconds = outcome.sandbox_seconds or (time.monotonic() - started)
        try:
            lines = run_log.drain()
            for tries_left in (2, 1, 0):
                try:
                    if run.id in self._interrupted and outcome.status == CANCELLED:
                        self._requeue_interrupted(run, lines)
                    else:
                        finish_attempt(
                            self.ctx,
                            run=run,
                            outcome=outcome,
                            backoff=backoff,
                            exponential=exponential,
                            log_lines=lines,
                        )
                    break
                except Exception:  # a store hiccup must not strand the run; retry, then
                    # leave it to the reaper, which requeues it once the lease expires
                    log.exception("recording the end of %s failed", run.id)
                    if tries_left:
                        self._stop.wait(0.5)
        finally:
            with self._active_lock:
                # A resumed run may already be back here as a new attempt: leave that one be.
                if self._active.get(run.id) is run_log:
                    self._active.pop(run.id, None)
                    self._cancel.discard(run.id)
                    self.ctx.local_cancels.discard(run.id)
            self.ctx.run_queued.set()

    def _requeue_interrupted(self, run: Run, lines: list[tuple[str, str, datetime | None]]) -> None:
        with session_scope(self.ctx.engine, write=True) as s:
            if lines:
                append_events(s, run_id=run.id, attempt=run.attempt, lines=lines)
            current = s.get(Run, run.id)
            if current is None or current.status != RUNNING or current.cancel_requested:
                return
            system_event(
                s,
                run_id=run.id,
                attempt=current.attempt,
                message="interrupted by node shutdown; requeued",
            )
            current.status = QUEUED
            current.attempt += 1
            current.max_attempts += 1  # an interruption is not the worker's failure
            current.lease_owner = None
            current.lease_expires_at = None
            current.started_at = None
            s.add(current)

    def _execute(self, run: Run, version: Version, manifest: Manifest, run_log: RunLog) -> Outcome:
        if is_phased(manifest):
            return execute_phased(self, run, version, manifest, run_log)
        values, missing = secret_service.resolve(self.ctx, manifest.secrets)
        if missing:
            names = ", ".join(missing)
            return Outcome(
                status=FAILED,
                error_code="secret_missing",
                error_message=f"secret {names} is not set; set it with "
                f"`floom secrets set {missing[0]}`",
                retryable=False,
            )
        redactor = Redactor(values.values())
        run_log.redact_with(redactor)
        base = self.ctx.settings.work_root / f"{run.id}-{run.attempt}"
        workdir, output_dir = base / "work", base / "output"
        try:
            self._prepare(version, workdir, output_dir, run)
            spec = script_spec(
                run, manifest, workdir=workdir, output_dir=output_dir, secrets=values
            )
            t0 = time.monotonic()
            result = self.sandbox.run(
                spec, on_line=run_log.add, should_cancel=lambda: self._should_cancel(run.id)
            )
            elapsed = time.monotonic() - t0
            outcome = self._judge(result, workdir, output_dir, manifest, run_log)
            outcome.sandbox_seconds = elapsed
            return redact_outcome(outcome, redactor)
        finally:
            discard_later(base)

    def _prepare(self, version: Version, workdir: Path, output_dir: Path, run: Run) -> None:
        source = self._version_files(version)
        shutil.copytree(source, workdir)
        output_dir.mkdir(parents=True)
        (workdir / "inputs.json").write_text(run.inputs_json)

    def _version_files(self, version: Version) -> Path:
        """The version's files unpacked once per node; versions never change."""
        target = self.ctx.settings.data_dir / "versions" / version.digest
        if target.is_dir():
            return target
        bundle = workers.load_bundle(self.ctx, version=version)
        tmp = target.with_name(f"{version.digest}.{threading.get_ident()}.tmp")
        shutil.rmtree(tmp, ignore_errors=True)
        tmp.mkdir(parents=True)
        bundle.write_to(tmp)
        try:
            tmp.rename(target)
        except OSError:  # another thread unpacked it first
            shutil.rmtree(tmp, ignore_errors=True)
        return target

    def _judge(
        self,
        result: SandboxResult,
        workdir: Path,
        output_dir: Path,
        manifest: Manifest,
        run_log: RunLog,
    ) -> Outcome:
        if result.cancelled:
            return Outcome(
                status=CANCELLED, error_code="cancelled", error_message="cancelled", retryable=False
            )
        if result.timed_out:
            return Outcome(
                status=TIMED_OUT,
                error_code="timed_out",
                error_message=f"timed out after {manifest.limits.timeout_seconds}s "
                "(limits.timeout_seconds in worker.yml)",
            )
        if result.error:
            return Outcome(status=FAILED, error_code="sandbox_error", error_message=result.error)
        report, problem = _read_result(workdir / "result.json")
        if problem:
            return Outcome(
                status=FAILED,
                error_code="result_invalid",
                error_message=problem,
                exit_code=result.exit_code,
                retryable=False,
            )
        if report.get("error"):
            return Outcome(
                status=FAILED,
                error_code="worker_error",
                error_message=str(report["error"]),
                exit_code=result.exit_code,
                retryable=bool(report.get("retryable", True)),
                outputs=report.get("outputs"),
            )
        if result.exit_code != 0:
            detail = f": {run_log.last_stderr}" if run_log.last_stderr else ""
            return Outcome(
                status=FAILED,
                error_code="exit_code",
                error_message=f"the script exited with code {result.exit_code}{detail}",
                exit_code=result.exit_code,
                retryable=bool(report.get("retryable", True)),
            )
        outputs = report.get("outputs") or {}
        problems = manifest.check_outputs(outputs)
        if problems:
            return Outcome(
                status=FAILED,
                error_code="outputs_invalid",
                error_message="outputs do not match worker.yml: "
                + "; ".join(f"{p.path}: {p.message}" for p in problems),
                exit_code=result.exit_code,
                outputs=outputs,
                retryable=False,
            )
        artifacts, art_problem = _collect_artifacts(
            output_dir, limit=self.ctx.settings.max_artifact_bytes
        )
        if art_problem:
            run_log.add("system", art_problem)
        return Outcome(
            status=SUCCEEDED, outputs=outputs, exit_code=result.exit_code, artifacts=artifacts
        )


def _read_result(path: Path) -> tuple[dict[str, Any], str | None]:
    if not path.exists():
        return {}, None
    try:
        report = json.loads(path.read_text())
    except (ValueError, UnicodeDecodeError) as exc:
        return {}, f"result.json is not valid JSON ({exc})"
    if not isinstance(report, dict):
        return {}, 'result.json must be an object like {"outputs": {...}}'
    if "outputs" in report and not isinstance(report["outputs"], dict):
        return {}, 'result.json "outputs" must be an object of output names to values'
    return report, None


def _collect_artifacts(
    output_dir: Path, *, limit: int
) -> tuple[list[tuple[str, bytes, str]], str | None]:
    found: list[tuple[str, bytes, str]] = []
    total = 0
    for p in sorted(output_dir.rglob("*")):
        if p.is_symlink() or not p.is_file():
            continue
        size = p.stat().st_size
        if total + size > limit:
            return found, (
                f"artifacts over {limit // (1024 * 1024)} MiB were not kept "
                "(FLOOM_MAX_ARTIFACT_BYTES)"
            )
        total += size
        name = p.relative_to(output_dir).as_posix()
        content_type = mimetypes.guess_type(name)[0] or "application/octet-stream"
        found.append((name, p.read_bytes(), content_type))
    return found, None
