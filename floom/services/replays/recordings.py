"""An agent run's record read as a recording: the model turns it got, the tool calls it made
with the results the model read, and how it ended. Replays and their diffs are built on it."""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from floom import jsonvalues
from floom.errors import NotReplayable, RunErrorCode
from floom.hints import act, told
from floom.services.access.principal import SYSTEM, Principal
from floom.services.runs import agent as agent_runs
from floom.services.runs import lifecycle as runs
from floom.services.runs.rules import FINISHED, SKIPPED
from floom.services.workers import versions as workers
from floom.vocabulary import RunStatus, ToolCallStatus

if TYPE_CHECKING:
    from floom.services.context import Context
    from floom.store.models import Run

# What the loop answers a call to a tool the worker does not have; such calls never reach a
# tool, so a replay leaves them to the loop as well.
UNKNOWN_TOOL_PREFIX = "refused: no tool '"
# How a what-if replay's refusal of a call it cannot answer from the recording begins.
NOT_RECORDED = "not in the recording"


@dataclass(frozen=True)
class RecordedCall:
    """One tool call as the model made it and the result it read (both redacted)."""

    use_id: str
    name: str
    arguments: dict[str, Any]
    content: str
    is_error: bool
    # The status floom stored for the call (ok, error, rejected, refused...); None when the
    # run's tool-call records do not line up with its transcript (a crash between the two).
    status: ToolCallStatus | None


@dataclass(frozen=True)
class Recording:
    run_id: str
    worker_name: str
    version_id: str
    model: str
    system: str
    messages: list[dict[str, Any]]
    # Each model turn's content, and the index in `messages` where it starts.
    turns: list[list[dict[str, Any]]]
    turn_starts: list[int]
    # Tokens billed per model turn; None for runs recorded before floom kept them.
    turn_usage: list[tuple[int, int]] | None
    calls: list[RecordedCall]
    # The tool names the model was offered, in order (None for older runs).
    tool_names: list[str] | None
    gated_tools: list[str]
    status: RunStatus
    error_code: RunErrorCode | None
    error_message: str | None
    outputs: dict[str, Any] | None


def canonical(value: Any) -> str:
    """Arguments normalised for matching: keys sorted, text stripped, null members dropped."""
    return json.dumps(_normalise(value), sort_keys=True, separators=(",", ":"))


def _normalise(value: Any) -> Any:
    if isinstance(value, dict):
        return {str(k): _normalise(v) for k, v in value.items() if v is not None}
    if isinstance(value, list):
        return [_normalise(v) for v in value]
    if isinstance(value, str):
        return value.strip()
    return value


def load_recording(ctx: Context, *, run_id: str, caller: Principal) -> Recording:
    """The recording of a finished agent run; NotReplayable says why a run has none. Needs
    the read scope."""
    run = runs.get_run(ctx, run_id=run_id, caller=caller)
    check_replayable(ctx, run=run)
    transcript = agent_runs.load_transcript(ctx, run_id=run.id, caller=caller)
    if transcript is None:
        raise NotReplayable(
            f"run {run.id} kept no transcript",
            hint="only agent runs that reached the model can be replayed",
        )
    messages: list[dict[str, Any]] = jsonvalues.stored(transcript.messages_json, expect=list)
    state = jsonvalues.stored(transcript.state_json or "{}", expect=dict)
    stored = agent_runs.list_tool_calls(ctx, run_id=run.id, caller=caller)
    turns: list[list[dict[str, Any]]] = []
    starts: list[int] = []
    uses: list[tuple[dict[str, Any], dict[str, Any] | None]] = []
    for index, message in enumerate(messages):
        if message.get("role") != "assistant":
            continue
        content = message.get("content") or []
        turns.append(content)
        starts.append(index)
        answers = _results_after(messages, index)
        uses.extend(
            (block, answers.get(str(block.get("id"))))
            for block in content
            if block.get("type") == "tool_use"
        )
    # The stored calls follow the tool_use blocks one for one, as the loop handled them.
    statuses: list[ToolCallStatus | None] = [None] * len(uses)
    if len(stored) <= len(uses) and all(
        c.tool == str(u.get("name")) for c, (u, _) in zip(stored, uses, strict=False)
    ):
        statuses[: len(stored)] = [c.status for c in stored]
    calls = [
        RecordedCall(
            use_id=str(block.get("id")),
            name=str(block.get("name")),
            arguments=block["input"] if isinstance(block.get("input"), dict) else {},
            content=_text_of(answer.get("content")),
            is_error=bool(answer.get("is_error")),
            status=status,
        )
        for (block, answer), status in zip(uses, statuses, strict=True)
        if answer is not None  # the run ended before this call was answered
    ]
    usage = state.get("turn_usage")
    return Recording(
        run_id=run.id,
        worker_name=run.worker_name,
        version_id=run.version_id,
        model=transcript.model,
        system=transcript.system,
        messages=messages,
        turns=turns,
        turn_starts=starts,
        turn_usage=[(int(i), int(o)) for i, o in usage] if isinstance(usage, list) else None,
        calls=calls,
        tool_names=state.get("tool_names"),
        gated_tools=list(state.get("gated_tools") or []),
        status=run.status,
        error_code=run.error_code,
        error_message=run.error_message,
        outputs=jsonvalues.stored(run.outputs_json, expect=dict) if run.outputs_json else None,
    )


def check_replayable(ctx: Context, *, run: Run) -> None:
    """Refuse (NotReplayable) a run with no whole recording: unfinished, or a script's. A
    rule about a run its caller has read already, so the version is read as floom."""
    if run.status not in FINISHED or run.status == SKIPPED:
        raise NotReplayable(
            f"run {run.id} is {run.status}; only finished runs have a whole recording",
            hint=told("wait for it to end: ", act("logs", follow=True, run_id=run.id)),
        )
    version = workers.get_version(ctx, version_id=run.version_id, caller=SYSTEM)
    if version.kind != "agent":
        raise NotReplayable(
            f"run {run.id} is a script run; replays from a recording are for agent runs",
            hint=told(act("replay", run_id=run.id), " runs a script's inputs again, live"),
        )


def _results_after(messages: list[dict[str, Any]], index: int) -> dict[str, dict[str, Any]]:
    """The tool_result blocks of the user turn that answers the assistant turn at `index`."""
    if index + 1 >= len(messages):
        return {}
    content = messages[index + 1].get("content")
    if not isinstance(content, list):
        return {}
    return {
        str(b.get("tool_use_id")): b
        for b in content
        if isinstance(b, dict) and b.get("type") == "tool_result"
    }


def _text_of(content: Any) -> str:
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        return "".join(str(b.get("text", "")) for b in content if isinstance(b, dict))
    return ""
