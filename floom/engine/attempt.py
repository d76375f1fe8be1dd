"""One attempt of a run on this node, as one pipeline that plain scripts, approval phases and
an agent's `run_command` all go through: the work dir, the secrets and their redaction, the
sandbox, the judge of what the script left, and the collection of its artifacts."""

from __future__ import annotations

import errno
import json
import shutil
import threading
import time
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from dataclasses import replace
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

from floom.engine.cleanup import discard_later
from floom.engine.collect import COLLECT_MIN_SECONDS, Collected, collect_artifacts, read_result
from floom.engine.queue import Outcome, StateChange
from floom.engine.runlog import RunLog
from floom.engine.safefiles import Bounds, Refused, write_regular
from floom.engine.script import STATE_FILE, redact_outcome, script_spec
from floom.errors import FloomError, RunErrorCode, run_error_code
from floom.hints import act, told
from floom.hints import cli as cli_hints
from floom.sandbox import e2b_api_key
from floom.sandbox.base import SandboxUnavailable
from floom.sandbox.fence import fence_key
from floom.services.access import secrets as secret_service
from floom.services.access.secrets import Redactor
from floom.services.runs import agent as agent_runs
from floom.services.runs.rules import CANCELLED, FAILED, LIMIT_EXCEEDED, SUCCEEDED, TIMED_OUT
from floom.services.workers import state as worker_state
from floom.services.workers import versions as workers

if TYPE_CHECKING:
    from floom.manifest.schema import Manifest
    from floom.sandbox.base import (
        LineSink,
        Sandbox,
        SandboxResult,
        SandboxSession,
        SandboxSpec,
        StartedAhead,
    )
    from floom.services.context import Context
    from floom.store.models import Run, Version


class AttemptHost(Protocol):
    """The node an attempt runs on (the executor): its context, the sandbox backend of a
    worker, whether a run is to stop, and a way to run a run it just claimed in the calling
    thread."""

    ctx: Context

    def sandbox_for(self, manifest: Manifest) -> Sandbox: ...

    def should_cancel(self, run_id: str) -> bool: ...

    def run_claimed_inline(self, run: Run) -> None: ...


def missing_secret_outcome(missing: list[str]) -> Outcome:
    return Outcome(
        status=FAILED,
        error_code=RunErrorCode.SECRET_MISSING,
        # Stored as the CLI writes it; each surface reads it back in its terms.
        error_message=cli_hints.written(
            told(
                f"secret {', '.join(missing)} is not set; set it with ",
                act("secrets set", name=missing[0]),
            )
        ),
        retryable=False,
    )


def sandbox_unavailable_outcome(exc: SandboxUnavailable, redactor: Redactor) -> Outcome:
    """The attempt's end when its sandbox could not run: not the script's fault, retried."""
    hint = f"; {exc.hint}" if exc.hint else ""
    outcome = Outcome(
        status=FAILED,
        error_code=run_error_code(exc),
        error_message=f"{exc.message}{hint}",
        retryable=exc.retryable,
    )
    return redact_outcome(outcome, redactor)


def cancelled_outcome() -> Outcome:
    return Outcome(
        status=CANCELLED,
        error_code=RunErrorCode.CANCELLED,
        error_message="cancelled",
        retryable=False,
    )


# The folder under the data dir that holds each version's files, unpacked once per node.
VERSIONS_DIR = "versions"
UNPACKING = ".tmp"


def version_files(ctx: Context, version: Version) -> Path:
    """The version's files unpacked once per node; versions never change. Raises OSError,
    leaving no partial copy (a full disk is most of all where none may stay)."""
    target = ctx.settings.data_dir / VERSIONS_DIR / version.digest
    if target.is_dir():
        return target
    bundle = workers.load_bundle(ctx, version=version)
    tmp = target.with_name(f"{version.digest}.{threading.get_ident()}{UNPACKING}")
    shutil.rmtree(tmp, ignore_errors=True)
    try:
        tmp.mkdir(parents=True)
        bundle.write_to(tmp)
    except OSError:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    try:
        tmp.rename(target)
    except OSError:  # another thread unpacked it first
        shutil.rmtree(tmp, ignore_errors=True)
    return target


def drop_partial_unpacks(data_dir: Path) -> int:
    """At start-up, while no attempt runs here (the work root is held): remove the partial
    copies of versions' files that a killed process left; how many went."""
    partial = list((data_dir / VERSIONS_DIR).glob(f"*{UNPACKING}"))
    for path in partial:
        shutil.rmtree(path, ignore_errors=True)
    return len(partial)


class _CopyFailed(Exception):
    """A file of the version could not be copied into the work dir (not an OSError, so that
    copytree passes it on at once)."""

    def __init__(self, error: OSError) -> None:
        super().__init__(str(error))
        self.error = error


def _copy_or_stop(source: str, target: str) -> object:
    try:
        return shutil.copy2(source, target)
    except OSError as exc:
        raise _CopyFailed(exc) from exc


def files_unwritable(exc: OSError) -> SandboxUnavailable:
    """Why this node could not write a run's files, in floom's words: the system's reason,
    not the host's paths (a run's error is shown to every read key)."""
    reason = exc.strerror or type(exc).__name__
    if exc.errno in (errno.ENOSPC, errno.EDQUOT):
        return SandboxUnavailable(
            f"this node's disk is full: floom could not write the run's files ({reason})",
            hint="free space on the disk that holds FLOOM_DATA_DIR on this node (old runs' "
            "folders are removed by floom itself; look for other files), or give it a larger one",
        )
    return SandboxUnavailable(
        f"floom could not write the run's files on this node ({reason})",
        hint="check that FLOOM_DATA_DIR on this node is a writable folder on a working disk",
    )


class Attempt:
    """One attempt of one run: its work dir (`workdir`, `output_dir` under `base`), its
    secrets and redactor, the sandbox runs it made and how long they took."""

    def __init__(
        self,
        host: AttemptHost,
        *,
        run: Run,
        version: Version,
        manifest: Manifest,
        run_log: RunLog,
        ahead: bool = False,
    ) -> None:
        self.host = host
        self.ctx = host.ctx
        self.run = run
        self.version = version
        self.manifest = manifest
        self.run_log = run_log
        # An attempt started ahead (start_script_ahead) has dirs of its own: when its run is
        # queued for the dispatcher after all, a claim of the run may prepare the plain ones
        # while these are being discarded.
        suffix = ".ahead" if ahead else ""
        self.base = self.ctx.settings.work_root / f"{run.id}-{run.attempt}{suffix}"
        self.workdir = self.base / "work"
        self.output_dir = self.base / "output"
        # The version's cached files when the sandbox lays the work dir over them.
        self.files: Path | None = None
        self.secrets: dict[str, str] = {}
        self.redactor = Redactor([])
        self.sandbox_seconds = 0.0
        # When the run's time is up (monotonic): collecting what it left is bounded by it.
        self.deadline: float | None = None
        self.open_session: SandboxSession | None = None
        # For a worker with `state:`, the version this attempt started from (see prepare),
        # and the state it leaves once its end is judged.
        self.state: StateChange | None = None
        self.state_read = "null"

    def cancelled(self) -> bool:
        return self.host.should_cancel(self.run.id)

    def resolve_secrets(
        self, names: Iterable[str], *, also_redact: Iterable[str] = ()
    ) -> Outcome | None:
        """Resolve the named secrets into `secrets` and redact their values (and
        `also_redact`) from the run's log from now on. Returns the outcome that ends the
        attempt when one of them is not set, else None."""
        names = list(names)
        if refused := secret_service.refused_for_runs(names):
            return Outcome(
                status=FAILED,
                error_code=RunErrorCode.SECRET_NAME_REFUSED,
                error_message=refused,
                retryable=False,
            )
        values, missing = secret_service.resolve(self.ctx, names)
        if missing:
            return missing_secret_outcome(missing)
        self.secrets = values
        # The E2B key is a provider key, the S3 secret floom's own: never in a run's log,
        # outputs or errors.
        self.redactor = Redactor(
            [
                *values.values(),
                *also_redact,
                e2b_api_key(self.ctx.settings),
                self.ctx.settings.s3_secret_access_key,
            ]
        )
        self.run_log.redact_with(self.redactor)
        return None

    @contextmanager
    def workspace(self, *, layered: bool = False, prepared: bool = False) -> Iterator[None]:
        """The prepared work dir for the block (`prepared`: by the caller already); discarded
        after it, whatever happens. See `prepare` for `layered`."""
        try:
            if not prepared:
                self.prepare(layered=layered)
            yield
        finally:
            self.discard()

    def discard(self) -> None:
        """Delete the work dir in the background, after its sandbox let go of it (a run dir
        with a disk of its own is unmounted first), both off the slot's path."""
        try:
            sandbox = self.host.sandbox_for(self.manifest)
        except FloomError:
            # No backend for it now, so none made the run dir: nothing to let go of.
            discard_later(self.base)
            return
        sandbox.discard_run_dir(self.base, delete=discard_later)

    def prepare(self, *, layered: bool = False) -> None:
        """The work dir with the version's files and `inputs.json`, and an empty output dir.

        `layered`: floom reads back only what the process writes (a script's result.json),
        so where the sandbox can lay the work dir over the version's cached files, they are
        not copied: the work dir starts with `inputs.json` alone (SandboxSpec.files).

        Raises SandboxUnavailable when this node cannot write them (its disk is full, say):
        the node's trouble, not the worker's, so the run is tried again by its policy."""
        try:
            self._prepare(layered=layered)
        except _CopyFailed as exc:
            raise files_unwritable(exc.error) from exc.error
        except OSError as exc:
            raise files_unwritable(exc) from exc

    def _prepare(self, *, layered: bool) -> None:
        files = version_files(self.ctx, self.version)
        sandbox = self.host.sandbox_for(self.manifest)
        # Where the backend bounds the run's disk with a filesystem of its own, both dirs
        # are on it (a copy of the version's files counts toward it).
        sandbox.make_run_dir(self.base, disk_mb=self.manifest.limits.disk_mb)
        if layered and sandbox.layers_files:
            self.files = files
            self.workdir.mkdir()
        else:
            # Stops at the first file that cannot be copied (copytree would try every other
            # file on a full disk, then raise their errors as one, without an errno).
            shutil.copytree(files, self.workdir, copy_function=_copy_or_stop)
        self.output_dir.mkdir()
        write_regular(self.workdir, "inputs.json", self.run.inputs_json.encode())
        if self.manifest.state.enabled:
            self.read_state()

    def read_state(self) -> None:
        """The state the run starts from, in `state.json` (null before the first one): for
        the script to read; what it leaves there is never read back."""
        base = worker_state.base_of_run(self.ctx, run=self.run)
        # A replay starts from its original's state: running it again could never help.
        retry = self.manifest.state.on_conflict == "retry" and self.run.replay_of is None
        self.state = StateChange(base=base.version, retry_on_conflict=retry, owner=base.owner)
        self.state_read = json.dumps(base.value)
        write_regular(self.workdir, STATE_FILE, self.state_read.encode())

    def leave_state(self, value: Any) -> FloomError | None:
        """Keep `value` (secrets masked) as the state to commit if the run succeeds; why it
        cannot be kept (StateTooLarge, StateInvalid), else None."""
        if self.state is None:
            return None
        limit = worker_state.limit_of(self.manifest, self.ctx.settings)
        try:
            text = worker_state.encode(self.redactor.value(value), limit=limit)
        except FloomError as exc:
            return exc
        self.state = replace(self.state, new_json=text)
        return None

    def with_state(self, outcome: Outcome) -> Outcome:
        """`outcome` carrying the attempt's state: its base always (the run records what it
        started from), its new state only on success."""
        if self.state is not None and outcome.state is None:
            keep = outcome.status == SUCCEEDED
            outcome.state = self.state if keep else replace(self.state, new_json=None)
        return outcome

    def restore_artifacts(self, *, of_run: str | None = None) -> int:
        """Write the artifacts the run stored when it paused back into the output dir, or
        those of run `of_run` (the original of an exact replay, whose tools never run)."""
        count = 0
        for name, data in agent_runs.paused_artifacts(self.ctx, run_id=of_run or self.run.id):
            try:
                write_regular(self.output_dir, name, data)
            except (Refused, OSError) as exc:
                self.run_log.add("system", f"artifact {name} was not restored: {exc}")
                continue
            count += 1
        return count

    def spec(
        self,
        *,
        secrets: dict[str, str] | None = None,
        phase: str | None = None,
        command: list[str] | None = None,
        timeout_seconds: float | None = None,
    ) -> SandboxSpec:
        return script_spec(
            self.run,
            self.manifest,
            workdir=self.workdir,
            output_dir=self.output_dir,
            secrets=self.secrets if secrets is None else secrets,
            phase=phase,
            command=command,
            timeout_seconds=timeout_seconds,
            node_id=self.ctx.node_id,
            files=self.files,
        )

    @contextmanager
    def session(self) -> Iterator[None]:
        """Within the block, the attempt's sandbox runs share one session (one sandbox on a
        remote backend, its files kept between commands); it is closed when the block ends,
        whatever happens (the run ended, paused for approval or failed)."""
        session = self.host.sandbox_for(self.manifest).open_session()
        self.open_session = session
        try:
            yield
        finally:
            self.open_session = None
            session.close()

    def run_sandbox(
        self,
        spec: SandboxSpec,
        *,
        on_line: LineSink | None = None,
        ahead: StartedAhead | None = None,
    ) -> SandboxResult:
        """Run one process in the sandbox (in the open session, if any; `ahead`: the one
        started ahead for `spec`); its lines go to the run's log unless `on_line`. Raises
        SandboxUnavailable as the backend does."""
        t0 = time.monotonic()
        if self.deadline is None:
            self.deadline = t0 + spec.timeout_seconds
        sink = on_line or self.run_log
        try:
            if ahead is not None:
                return ahead.run(on_line=sink, should_cancel=self.cancelled)
            runner = self.open_session or self.host.sandbox_for(self.manifest)
            return runner.run(spec, on_line=sink, should_cancel=self.cancelled)
        finally:
            self.sandbox_seconds += time.monotonic() - t0

    def judge(
        self, result: SandboxResult, *, pinned_outputs: dict[str, Any] | None = None
    ) -> Outcome:
        """How the script's attempt ended, from the sandbox's result and what it left, with
        secrets redacted. `pinned_outputs` replace the outputs the script reports (the apply
        phase runs with the approved ones); its `error` and `retryable` still count."""
        outcome = self._judge(result, pinned_outputs)
        outcome.sandbox_seconds = self.sandbox_seconds
        return self.with_state(redact_outcome(outcome, self.redactor))

    def _judge(self, result: SandboxResult, pinned: dict[str, Any] | None) -> Outcome:
        manifest = self.manifest
        if result.cancelled:
            return cancelled_outcome()
        if result.timed_out:
            return Outcome(
                status=TIMED_OUT,
                error_code=RunErrorCode.TIMED_OUT,
                error_message=f"timed out after {manifest.limits.timeout_seconds}s "
                "(limits.timeout_seconds in worker.yml)",
            )
        if result.limit_exceeded:
            return Outcome(
                status=LIMIT_EXCEEDED,
                error_code=RunErrorCode.LIMIT_EXCEEDED,
                error_message=result.error or f"the {result.limit_exceeded} limit was reached",
                exit_code=result.exit_code,
                retryable=False,
            )
        if result.error:
            return Outcome(
                status=FAILED, error_code=RunErrorCode.SANDBOX_ERROR, error_message=result.error
            )
        report, problem = read_result(self.workdir, limit=self.ctx.settings.max_result_bytes)
        if problem:
            return Outcome(
                status=FAILED,
                error_code=RunErrorCode.RESULT_INVALID,
                error_message=problem,
                exit_code=result.exit_code,
                retryable=False,
            )
        if pinned is not None:
            report["outputs"] = pinned
        if report.get("error"):
            return Outcome(
                status=FAILED,
                error_code=RunErrorCode.WORKER_ERROR,
                error_message=str(report["error"]),
                exit_code=result.exit_code,
                retryable=bool(report.get("retryable", True)),
                outputs=report.get("outputs"),
            )
        if result.exit_code != 0:
            last = self.run_log.last_stderr
            detail = f": {last}" if last else ""
            return Outcome(
                status=FAILED,
                error_code=RunErrorCode.EXIT_CODE,
                error_message=f"the script exited with code {result.exit_code}{detail}",
                exit_code=result.exit_code,
                retryable=bool(report.get("retryable", True)),
            )
        outputs = report.get("outputs") or {}
        problems = manifest.check_outputs(outputs)
        if problems:
            return Outcome(
                status=FAILED,
                error_code=RunErrorCode.OUTPUTS_INVALID,
                error_message="outputs do not match worker.yml: "
                + "; ".join(f"{p.path}: {p.message}" for p in problems),
                exit_code=result.exit_code,
                outputs=outputs,
                retryable=False,
            )
        if "state" in report and self.state is None:
            self.run_log.add(
                "system", "result.json holds a state, which is ignored: worker.yml has no state"
            )
        elif "state" in report and (refused := self.leave_state(report["state"])):
            return Outcome(
                status=FAILED,
                error_code=run_error_code(refused),
                error_message=f"result.json: {refused.message} ({refused.hint})",
                exit_code=result.exit_code,
                outputs=outputs,
                retryable=False,
            )
        collected = self.collect_artifacts()
        if collected.cancelled:
            return cancelled_outcome()
        return Outcome(
            status=SUCCEEDED,
            outputs=outputs,
            exit_code=result.exit_code,
            artifacts=collected.artifacts,
        )

    def bounds(self) -> Bounds:
        """How long floom may spend on the files the run left: the rest of its time, and a
        few seconds at least, stopping at once when it is cancelled."""
        now = time.monotonic()
        deadline = max(self.deadline or now, now + COLLECT_MIN_SECONDS)
        return Bounds(deadline=deadline, should_cancel=self.cancelled)

    def collect_artifacts(self) -> Collected:
        """The files under the output dir as the run's artifacts, secrets redacted; what is
        not kept is said in the run's log."""
        collected = collect_artifacts(
            self.output_dir,
            limit=self.ctx.settings.max_artifact_bytes,
            bounds=self.bounds(),
            redactor=self.redactor,
        )
        for note in collected.notes:
            self.run_log.add("system", note)
        return collected


def run_script(attempt: Attempt, *, ahead: StartedAhead | None = None) -> Outcome:
    """One attempt of a script worker without a run-level approval. `ahead`: its sandbox,
    started ahead by `start_script_ahead` (its secrets resolved, its work dir prepared)."""
    if ahead is None:
        ended = attempt.resolve_secrets(attempt.manifest.secrets)
        if ended is not None:
            return ended
    with attempt.workspace(layered=True, prepared=ahead is not None):
        if ahead is None:
            result = attempt.run_sandbox(attempt.spec())
        else:
            try:
                result = attempt.run_sandbox(ahead.spec, ahead=ahead)
            finally:
                ahead.discard()  # ends it only if something failed before its run
        return attempt.judge(result)


def start_script_ahead(attempt: Attempt) -> StartedAhead | None:
    """Start the sandbox of a script attempt up to its command, as run_script would start it
    (its secrets resolved, its work dir prepared): for `run_script(attempt, ahead=...)`.
    None when the backend cannot or a secret is missing; a step that fails raises, leaving
    nothing behind. Either way run_script then meets the same and says so."""
    sandbox = attempt.host.sandbox_for(attempt.manifest)
    if not sandbox.starts_ahead:
        return None
    if attempt.resolve_secrets(attempt.manifest.secrets) is not None:
        return None
    try:
        attempt.prepare(layered=True)
        # Started while its queueing transaction claims it, which gives the run the next
        # lease epoch: the watchdog knows its sandbox by that one.
        run = attempt.run
        spec = replace(attempt.spec(), fence=fence_key(run.id, run.lease_epoch + 1))
        ahead = sandbox.start_ahead(spec)
    except BaseException:
        attempt.discard()
        raise
    if ahead is None:
        attempt.discard()
    return ahead
