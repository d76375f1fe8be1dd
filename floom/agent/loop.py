"""The agent loop: ask the model, run the tool calls it makes, repeat until `finish`.

The transcript is the loop's whole state and is saved at every step: after each model turn
(with the tool calls still to answer) and after each answered call. Any attempt, in any
process, continues from it, which is how a run paused for approval resumes elsewhere and
how a crashed attempt picks up without repeating finished calls. The step that ends the
attempt is not saved by the loop: its transcript goes with the outcome (`unsaved`), and the
attempt's end saves it (engine/queue.finish_attempt), or, with object storage, puts its text
straight into the run's log object, so its row is written once at the end, not twice.
"""

from __future__ import annotations

import json
import logging
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from floom import jsonvalues
from floom.agent import workspace
from floom.agent.provider import ModelProvider, estimate_cost
from floom.agent.tools import RecordedToolError, Tool, ToolError
from floom.cut import cut
from floom.engine.queue import Outcome
from floom.errors import ProviderError, RunErrorCode, run_error_code
from floom.services.access.principal import SYSTEM
from floom.services.runs import agent as agent_runs
from floom.services.runs.approvals import (
    APPROVED,
    REJECTED_DECISION,
    get_approval,
    new_approval,
    pause_run,
)
from floom.services.runs.rules import (
    AWAITING_APPROVAL,
    CANCELLED,
    FAILED,
    LIMIT_EXCEEDED,
    SUCCEEDED,
)
from floom.store.models import new_id
from floom.vocabulary import ApprovalKind, RunStatus, ToolCallStatus

if TYPE_CHECKING:
    from floom.agent.builtin import AgentEnv
    from floom.agent.tools import Toolbox
    from floom.store.agents import Transcript

log = logging.getLogger("floom.agent")

MODEL_RESULT_CAP = 100 * 1024
MAX_NUDGES = 2
# Tool calls run from one model turn; the rest of the turn's calls are answered refused,
# unrun and unrecorded: a model (or whatever answers at the provider's address) can ask for
# any number in one turn, and each run call costs a record and a transcript save.
MAX_CALLS_PER_TURN = 32
LOG_TEXT_CAP = 500
NUDGE = (
    "You ended your turn without calling finish. Keep working with your tools, or call "
    "finish with the outputs to end the run."
)
APPLY_NOTE = (
    "A person approved your outputs (possibly edited: the approved values above are "
    "final). This is the apply phase: carry out what was approved, then call finish "
    "again (its outputs are ignored; the approved ones stand)."
)


class AgentLoop:
    def __init__(
        self,
        env: AgentEnv,
        *,
        transcript: Transcript,
        toolbox: Toolbox,
        provider: ModelProvider,
        replay: bool = False,
        stored: bool = False,
    ) -> None:
        self.env = env
        self.t = transcript
        self.toolbox = toolbox
        self.provider = provider
        # A replay never asks a person: it ends with the outputs a run would have proposed.
        self.replay = replay
        self.messages: list[dict[str, Any]] = jsonvalues.stored(
            transcript.messages_json, expect=list
        )
        state = jsonvalues.stored(transcript.state_json or "{}", expect=dict)
        self.state: dict[str, Any] = {
            "pending": state.get("pending") or [],
            "results": state.get("results") or [],
            "awaiting": state.get("awaiting"),
            "nudges": state.get("nudges") or 0,
            # The answers to a turn's calls past MAX_CALLS_PER_TURN, sent after the others.
            "overflow": state.get("overflow") or [],
            # Kept for replays: the tools offered, and each model turn's billed tokens.
            "tool_names": state.get("tool_names"),
            "gated_tools": state.get("gated_tools") or [],
            "turn_usage": state.get("turn_usage") or [],
        }
        limits = env.manifest.limits
        self.max_iterations = limits.max_tool_iterations or env.ctx.settings.agent_max_iterations
        self.max_tokens = limits.max_total_tokens
        self.monthly_cap = limits.monthly_cost_usd
        self._mark = time.monotonic()
        # Whether the transcript has a row (loaded from one, or saved by this loop): only
        # then may the last step's save be left to the attempt's end, which updates it.
        self.stored = stored
        # The last step's transcript, not saved yet (see the module's docstring).
        self.unsaved = False

    # -- the loop -----------------------------------------------------------------------------

    def run(self) -> Outcome:
        while True:
            if self.env.cancelled():
                return self._cancelled()
            if self.env.remaining() <= 0:
                seconds = self.env.manifest.limits.timeout_seconds
                return self._limit("timeout_seconds", f"{seconds}s of agent time")
            ended = self._answer_pending() if self.state["pending"] else self._model_turn()
            if ended is not None:
                return ended

    def checkpoint(self, *, last: bool = False) -> None:
        """Save the transcript as the loop leaves it; `last`: the step that ends the
        attempt, whose save is left to its end when the transcript has a row already."""
        now = time.monotonic()
        self.t.active_seconds += now - self._mark
        self._mark = now
        self.t.messages_json = jsonvalues.dumps(self.messages, where="messages")
        self.t.state_json = jsonvalues.dumps(self.state, where="state")
        if last and self.stored:
            self.unsaved = True
            return
        agent_runs.save_transcript(self.env.ctx, self.t)
        self.stored = True

    def _note(self, text: str) -> None:
        self.env.run_log.add("system", text)

    def _model_turn(self) -> Outcome | None:
        t, settings = self.t, self.env.ctx.settings
        if t.iterations >= self.max_iterations:
            return self._limit("max_tool_iterations", f"{self.max_iterations} model turns")
        max_out = settings.agent_max_output_tokens
        if self.max_tokens is not None:
            left = self.max_tokens - (t.input_tokens + t.output_tokens)
            if left <= 0:
                return self._limit("max_total_tokens", f"{self.max_tokens} tokens")
            max_out = min(max_out, left)
        live = LiveTurn(self._note)
        try:
            reply = self.provider.complete(
                model=t.model,
                system=t.system,
                messages=self.messages,
                tools=self.toolbox.definitions(),
                max_tokens=max_out,
                timeout=max(1.0, self.env.remaining()),
                progress=live,
            )
        except ProviderError as exc:
            if self.env.remaining() <= 0:
                seconds = self.env.manifest.limits.timeout_seconds
                return self._limit("timeout_seconds", f"{seconds}s of agent time")
            return self._end(FAILED, run_error_code(exc), exc.message, retryable=exc.retryable)
        t.iterations += 1
        t.input_tokens += reply.input_tokens
        t.output_tokens += reply.output_tokens
        t.cost_usd += estimate_cost(t.model, reply.input_tokens, reply.output_tokens)
        self.state["turn_usage"].append([reply.input_tokens, reply.output_tokens])
        # Sent back with every later turn: a lone surrogate in it would fail each of them.
        content = jsonvalues.sendable(self.env.redactor.value(reply.content)) or [
            {"type": "text", "text": "(empty)"}
        ]
        self.messages.append({"role": "assistant", "content": content})
        live.flush()
        for block in content if not live.shown else ():
            if block.get("type") == "text" and block.get("text", "").strip():
                self._note(f"agent: {_clip(block['text'], LOG_TEXT_CAP)}")
        self._note(
            f"model turn {t.iterations}: {reply.input_tokens} in + {reply.output_tokens} out tokens"
        )
        calls = [b for b in content if b.get("type") == "tool_use"]
        self.state["pending"] = calls[:MAX_CALLS_PER_TURN]
        self.state["overflow"] = [_overflowed(b) for b in calls[MAX_CALLS_PER_TURN:]]
        if self.state["overflow"]:
            self._note(
                f"{len(self.state['overflow'])} tool calls past the first {MAX_CALLS_PER_TURN} "
                "of this model turn refused, not run"
            )
        self.checkpoint()
        total = t.input_tokens + t.output_tokens
        if self.max_tokens is not None and total > self.max_tokens:
            return self._limit("max_total_tokens", f"{total} of {self.max_tokens} tokens used")
        if self.monthly_cap is not None:
            spent = agent_runs.month_cost(self.env.ctx, worker_name=self.env.run.worker_name)
            if spent >= self.monthly_cap:
                return self._limit(
                    "monthly_cost_usd", f"${spent:.4f} of ${self.monthly_cap:.2f} spent this month"
                )
        if not self.state["pending"]:
            self.state["nudges"] += 1
            if self.state["nudges"] > MAX_NUDGES:
                return self._end(
                    FAILED,
                    RunErrorCode.AGENT_ERROR,
                    "the agent kept ending its turn without calling finish",
                )
            self.messages.append({"role": "user", "content": NUDGE})
            self.checkpoint()
        return None

    def _answer_pending(self) -> Outcome | None:
        """Answer the next pending call; one at a time, so that `run` sees a cancellation or
        the end of the run's time between any two calls of a turn."""
        block = self.state["pending"][0]
        ended, result = self._handle(block)
        if ended is not None:
            return ended
        self.state["results"].append(result)
        self.state["pending"].pop(0)
        self.state["awaiting"] = None
        self.checkpoint()
        if self.state["pending"]:
            return None
        answers = [*self.state["results"], *self.state["overflow"]]
        self.messages.append({"role": "user", "content": answers})
        self.state["results"], self.state["overflow"] = [], []
        self.checkpoint()
        return None

    # -- one tool call ------------------------------------------------------------------------

    def _handle(self, block: dict[str, Any]) -> tuple[Outcome | None, dict[str, Any] | None]:
        use_id, name = str(block.get("id")), str(block.get("name"))
        raw = block.get("input")
        args: dict[str, Any] = raw if isinstance(raw, dict) else {}
        found = jsonvalues.breach_of(args, where="the input", strict_types=False)
        if found is not None:
            # Before anything walks the input (the redactor recurses) or stores it.
            message = f"refused: {found.message} ({found.limit} bound); {jsonvalues.bounds_hint()}"
            # The transcript keeps the marker too, so that it stays within the bounds.
            block["input"] = jsonvalues.unreadable(found.message)
            self._record(name, block["input"], ToolCallStatus.REFUSED, error=message)
            return None, _result(use_id, message, error=True)
        awaiting = self.state["awaiting"]
        if not awaiting or awaiting.get("tool_use_id") != use_id:
            awaiting = None
        tool = self.toolbox.get(name)
        if tool is None:
            message = (
                f"refused: no tool '{name}' is available to this worker; "
                f"available: {', '.join(self.toolbox.names())}"
            )
            self._record(name, args, ToolCallStatus.REFUSED, error=message)
            return None, _result(use_id, message, error=True)
        if tool.builtin == "finish":
            return self._finish(tool, use_id, args, awaiting)
        if awaiting is not None:
            return self._decided(tool, use_id, args, awaiting)
        if tool.gated:
            return self._pause(tool, use_id, args, kind=ApprovalKind.TOOL_CALL), None
        return None, self._execute(tool, use_id, args)

    def _decided(
        self, tool: Tool, use_id: str, args: dict[str, Any], awaiting: dict[str, Any]
    ) -> tuple[Outcome | None, dict[str, Any] | None]:
        approval = get_approval(self.env.ctx, approval_id=awaiting["approval_id"], caller=SYSTEM)
        call_id = awaiting["tool_call_id"]
        by = f" ({approval.decided_by})" if approval.decided_by else ""
        if approval.status == REJECTED_DECISION:
            message = (
                f"A person{by} rejected this call: {approval.comment}. Do not retry it "
                "unchanged; take the comment into account."
            )
            agent_runs.finish_tool_call(
                self.env.ctx,
                call_id=call_id,
                status=ToolCallStatus.REJECTED,
                arguments=args,
                error=message,
            )
            self._note(f"tool {tool.name} rejected{by}: {approval.comment}")
            return None, _result(use_id, message, error=True)
        if approval.status != APPROVED:
            return self._cancelled(), None
        edited = (
            jsonvalues.stored(approval.edited_json, expect=dict) if approval.edited_json else {}
        )
        args = {**args, **edited}
        if tool.builtin == "request_approval":
            answer = {"decision": "approved", "comment": approval.comment, "edited": edited or None}
            text = json.dumps(answer)
            agent_runs.finish_tool_call(
                self.env.ctx, call_id=call_id, status=ToolCallStatus.OK, arguments=args, result=text
            )
            return None, _result(use_id, text)
        return None, self._execute(tool, use_id, args, call_id=call_id)

    def _execute(
        self, tool: Tool, use_id: str, args: dict[str, Any], *, call_id: str | None = None
    ) -> dict[str, Any]:
        t0 = time.monotonic()
        text, error, failed = "", None, ToolCallStatus.ERROR
        try:
            text = tool.run(args)
        except RecordedToolError as exc:
            error, failed = exc.message, exc.call_status
        except ToolError as exc:
            error = exc.message
        except Exception as exc:  # a tool's bug must not end the run; the model is told
            log.exception("tool %s failed in run %s", tool.name, self.env.run.id)
            error = f"internal error in tool {tool.name}: {type(exc).__name__}"
        ms = int((time.monotonic() - t0) * 1000)
        redact = self.env.redactor
        text, error = redact.text(text), redact.text(error) if error else None
        status = failed if error else ToolCallStatus.OK
        if call_id:
            agent_runs.finish_tool_call(
                self.env.ctx,
                call_id=call_id,
                status=status,
                arguments=redact.value(args),
                result=text or None,
                error=error,
                duration_ms=ms,
            )
            self._note(f"tool {tool.name} -> {status} ({ms} ms)")
        else:
            self._record(tool.name, args, status, result=text or None, error=error, ms=ms)
        return _result(use_id, error or text, error=error is not None)

    def _record(
        self,
        tool: str,
        args: Any,
        status: ToolCallStatus,
        *,
        result: str | None = None,
        error: str | None = None,
        ms: int = 0,
        approval_id: str | None = None,
        call_id: str | None = None,
    ) -> None:
        redact = self.env.redactor
        safe_args = redact.value(args)
        stored = agent_runs.record_tool_call(
            self.env.ctx,
            run_id=self.env.run.id,
            attempt=self.env.run.attempt,
            tool=tool,
            arguments=safe_args,
            status=status,
            result=result,
            error=error,
            duration_ms=ms,
            approval_id=approval_id,
            call_id=call_id,
        )
        # For the end, which then need not read the run's calls back (RunLog.kept).
        self.env.run_log.keep_call(stored)
        shown = _clip(json.dumps(safe_args, default=str), 200)
        detail = f": {_clip(error, 200)}" if error else ""
        self._note(f"tool {tool} {shown} -> {status} ({ms} ms){detail}")

    # -- approvals and the end ----------------------------------------------------------------

    def _pause(
        self,
        tool: Tool,
        use_id: str,
        args: dict[str, Any],
        *,
        kind: ApprovalKind,
        proposed: dict[str, Any] | None = None,
    ) -> Outcome:
        env = self.env
        call_id, approval_id = new_id("tc"), new_id("apr")
        safe_args = env.redactor.value(args)
        self._record(
            tool.name,
            safe_args,
            ToolCallStatus.AWAITING_APPROVAL,
            approval_id=approval_id,
            call_id=call_id,
        )
        self.state["awaiting"] = {
            "approval_id": approval_id,
            "tool_call_id": call_id,
            "tool_use_id": use_id,
            "kind": kind,
        }
        self.t.workspace_digest = workspace.keep(env)
        self.checkpoint()
        approval = new_approval(
            run=env.run,
            kind=kind,
            proposed=proposed if kind == ApprovalKind.RUN and proposed is not None else safe_args,
            tool=tool.name,
            tool_call_id=call_id,
            approval_id=approval_id,
        )
        # The lines so far (the workspace's notes among them) are stored before the pause:
        # whoever sees the run awaiting approval sees all that led to it.
        env.run_log.flush(env.ctx)
        paused = pause_run(
            env.ctx,
            run=env.run,
            approval=approval,
            proposed_outputs=proposed if kind == ApprovalKind.RUN else None,
            artifacts=workspace.artifacts(env),
            sandbox_seconds=env.sandbox_seconds,
        )
        if not paused:
            return self._cancelled()
        return Outcome(status=AWAITING_APPROVAL)

    def _finish(
        self, tool: Tool, use_id: str, args: dict[str, Any], awaiting: dict[str, Any] | None
    ) -> tuple[Outcome | None, dict[str, Any] | None]:
        env = self.env
        approved = jsonvalues.stored(env.run.outputs_json or "{}", expect=dict)
        if env.apply and awaiting is not None:
            approval = get_approval(env.ctx, approval_id=awaiting["approval_id"], caller=SYSTEM)
            answer = {"decision": "approved", "outputs": approved, "comment": approval.comment}
            text = f"{json.dumps(answer)}\n{APPLY_NOTE}"
            agent_runs.finish_tool_call(
                env.ctx,
                call_id=awaiting["tool_call_id"],
                status=ToolCallStatus.OK,
                arguments=args,
                result=text,
            )
            self._note("apply phase: the agent continues with the approved outputs")
            return None, _result(use_id, text)
        if "state" in args and (refused := env.attempt.leave_state(args["state"])):
            message = f"the state cannot be kept: {refused.message} ({refused.hint})"
            self._record("finish", args, ToolCallStatus.ERROR, error=message)
            return None, _result(use_id, message, error=True)
        if env.apply:
            self._record(
                "finish", args, ToolCallStatus.OK, result="run finished with the approved outputs"
            )
            return self._succeed(approved), None
        outputs = args.get("outputs")
        if not isinstance(outputs, dict):
            message = 'finish needs {"outputs": {...}} with the declared outputs'
            self._record("finish", args, ToolCallStatus.ERROR, error=message)
            return None, _result(use_id, message, error=True)
        problems = env.manifest.check_outputs(outputs)
        if problems:
            message = "the outputs do not match the worker's declared outputs: " + "; ".join(
                f"{p.path}: {p.message}" for p in problems
            )
            self._record("finish", args, ToolCallStatus.ERROR, error=message)
            return None, _result(use_id, message, error=True)
        outputs = env.redactor.value(outputs)
        if env.manifest.approvals.get("required") and self.replay:
            self._note("replay: the run-level approval is not asked; the proposed outputs stand")
        elif env.manifest.approvals.get("required"):
            return self._pause(tool, use_id, args, kind=ApprovalKind.RUN, proposed=outputs), None
        self._record("finish", args, ToolCallStatus.OK, result="run finished")
        return self._succeed(outputs), None

    def _succeed(self, outputs: dict[str, Any]) -> Outcome:
        self.checkpoint(last=True)
        return Outcome(
            status=SUCCEEDED,
            outputs=outputs,
            artifacts=workspace.artifacts(self.env),
            sandbox_seconds=self.env.sandbox_seconds,
        )

    def _limit(self, name: str, detail: str) -> Outcome:
        message = f"limit {name} reached: {detail} (limits.{name} in worker.yml)"
        return self._end(LIMIT_EXCEEDED, RunErrorCode.LIMIT_EXCEEDED, message)

    def _cancelled(self) -> Outcome:
        return self._end(CANCELLED, RunErrorCode.CANCELLED, "cancelled")

    def _end(
        self, status: RunStatus, code: RunErrorCode, message: str, *, retryable: bool = False
    ) -> Outcome:
        if status in (FAILED, CANCELLED):
            # A retry, or a run requeued by a node shutdown, resumes with these files.
            self.t.workspace_digest = workspace.keep(self.env)
        self.checkpoint(last=True)
        return Outcome(
            status=status,
            error_code=code,
            error_message=message,
            retryable=retryable,
            artifacts=workspace.artifacts(self.env),
            sandbox_seconds=self.env.sandbox_seconds,
        )


class LiveTurn:
    """A streamed model turn written into the run log as it arrives (a line of text at a
    time, and each tool call as the model starts it), so followers see the agent think."""

    def __init__(self, note: Callable[[str], None]) -> None:
        self._note = note
        self._buffer = ""
        self.shown = False

    def text(self, piece: str) -> None:
        self._buffer += piece
        while "\n" in self._buffer:
            line, self._buffer = self._buffer.split("\n", 1)
            self._line(line)

    def tool_call(self, name: str) -> None:
        self.flush()
        self._note(f"agent calls {name}")
        self.shown = True

    def flush(self) -> None:
        self._line(self._buffer)
        self._buffer = ""

    def _line(self, line: str) -> None:
        if line.strip():
            self._note(f"agent: {_clip(line, LOG_TEXT_CAP)}")
            self.shown = True


def _result(use_id: str, text: str, *, error: bool = False) -> dict[str, Any]:
    # What a tool brought back (a file name of invalid UTF-8, an MCP server's JSON escape
    # without its pair) is sent to the model with every later turn: never a lone surrogate,
    # which no request can carry (the run failed 'could not run this attempt').
    text = jsonvalues.sendable(text)
    if len(text) > MODEL_RESULT_CAP:
        text = text[:MODEL_RESULT_CAP] + f"\n[... {len(text) - MODEL_RESULT_CAP} characters cut]"
    block: dict[str, Any] = {"type": "tool_result", "tool_use_id": use_id, "content": text}
    if error:
        block["is_error"] = True
    return block


def _overflowed(block: dict[str, Any]) -> dict[str, Any]:
    message = (
        f"refused: at most {MAX_CALLS_PER_TURN} tool calls of one turn are run; this one was "
        "not. Make fewer calls per turn and ask again for what you still need."
    )
    return _result(str(block.get("id")), message, error=True)


def _clip(text: str, cap: int) -> str:
    return cut(" ".join(text.split()), cap)
