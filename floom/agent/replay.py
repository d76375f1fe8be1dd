"""An agent run that replays another run's recording.

Exact: the recorded model turns stand in for the model and the recorded results answer every
tool call, so neither is called; each model request is checked against the recorded
conversation and each tool call against the recorded one, and the first difference ends the
replay (floom's own code handled the record differently). What-if: the model of the replay's
version is called for real; a tool call that matches a recorded one is answered from the
recording, any other is refused to the model ("not in the recording") unless the worker lists
the tool in `replay.live_tools`. Tools that need approval are never called live, and nothing a
replay does asks a person, starts a run or writes outside its own run.
"""

from __future__ import annotations

import copy
import dataclasses
import json
from collections import deque
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from floom.agent.builtin import finish_tool
from floom.agent.provider import ModelProvider, ModelReply, TurnProgress
from floom.agent.tools import RecordedToolError, Tool, Toolbox, ToolError
from floom.errors import RecordingEnded, ReplayDiverged
from floom.manifest.replay import NEVER_LIVE, replay_rules
from floom.services.access.principal import SYSTEM
from floom.services.replays import replay as replays
from floom.services.replays.recordings import (
    NOT_RECORDED,
    UNKNOWN_TOOL_PREFIX,
    RecordedCall,
    Recording,
    canonical,
    load_recording,
)
from floom.store.agents import Transcript
from floom.vocabulary import ToolCallStatus

if TYPE_CHECKING:
    from floom.agent.builtin import AgentEnv
    from floom.config import Settings
    from floom.services.context import Context
    from floom.store.models import Run

READ_ONLY_METHODS = ("GET", "HEAD")
SHOWN = 300


class ReplaySession:
    """What one replay attempt needs: the recording, the mode, and the first divergence."""

    def __init__(self, ctx: Context, *, run: Run, mode: str, model: str | None, rec: Recording):
        self.ctx, self.run, self.mode, self.model, self.rec = ctx, run, mode, model, rec
        self.divergence: dict[str, Any] | None = None
        self.turn = 0
        # The tools a what-if replay answers without asking a person, though a run would.
        self.gated: set[str] = set()

    @property
    def exact(self) -> bool:
        return self.mode == replays.EXACT

    def diverge(self, step: str, expected: Any, actual: Any) -> str:
        if self.divergence is None:
            self.divergence = {"step": step, "expected": expected, "actual": actual}
            replays.record_divergence(self.ctx, run_id=self.run.id, divergence=self.divergence)
        return f"the replay left its recording at {self.divergence['step']}"

    # -- the model ----------------------------------------------------------------------------

    def provider(self, build: Callable[[Settings], ModelProvider]) -> ModelProvider:
        return RecordedModel(self) if self.exact else build(self.ctx.settings)

    # -- the tools ----------------------------------------------------------------------------

    def toolbox(self, env: AgentEnv, build_live: Callable[[], Toolbox]) -> Toolbox:
        if self.exact:
            return self._exact_toolbox(env)
        live = build_live()
        self.gated = {t.name for t in live.tools() if t.gated}
        rules = replay_rules(env.manifest)
        matcher = RecordedAnswers(self.rec.calls)
        tools = []
        for tool in live.tools():
            if tool.builtin == "finish":
                tools.append(tool)
                continue
            may_run_live = (
                tool.name in rules.live_tools and not tool.gated and tool.builtin not in NEVER_LIVE
            )
            run = _answer_or_refuse(tool, matcher, live=may_run_live)
            tools.append(dataclasses.replace(tool, run=run, gated=False))
        return Toolbox(tools)

    def _exact_toolbox(self, env: AgentEnv) -> Toolbox:
        offered = [c for c in self.rec.calls if not c.content.startswith(UNKNOWN_TOOL_PREFIX)]
        from_calls = [c.name for c in offered]
        names = self.rec.tool_names or [*dict.fromkeys(from_calls), "finish"]
        expected = deque(c for c in self.rec.calls if c.name in names and c.name != "finish")
        tools = []
        for name in names:
            if name == "finish":
                # The loop runs finish itself, checking the outputs against the manifest.
                tools.append(finish_tool(env.manifest))
                continue
            tools.append(
                Tool(
                    name=name,
                    description="(replayed from the recording)",
                    input_schema={"type": "object"},
                    run=self._exact_answer(name, expected),
                )
            )
        return Toolbox(tools)

    def _exact_answer(
        self, name: str, expected: deque[RecordedCall]
    ) -> Callable[[dict[str, Any]], str]:
        def run(args: dict[str, Any]) -> str:
            if self.divergence is not None:
                raise ToolError(f"{NOT_RECORDED}: the replay already left its recording")
            call = expected.popleft() if expected else None
            got = {"tool": name, "arguments": args}
            if call is None or call.name != name or canonical(call.arguments) != canonical(args):
                step = len(self.rec.calls) - len(expected)
                want = {"tool": call.name, "arguments": call.arguments} if call else None
                raise ToolError(self.diverge(f"tool call {step} ({name})", want, got))
            return _recorded_answer(call)

        return run

    # -- the transcript -----------------------------------------------------------------------

    def exact_transcript(self) -> Transcript:
        """The original's start (its system prompt and first message), for this run."""
        rec, run = self.rec, self.run
        return Transcript(
            run_id=run.id,
            worker_name=run.worker_name,
            model=rec.model,
            system=rec.system.replace(rec.run_id, run.id),
            messages_json=json.dumps(rec.messages[:1]),
            state_json=json.dumps({"tool_names": rec.tool_names, "gated_tools": rec.gated_tools}),
        )


def replay_session(ctx: Context, *, run: Run) -> ReplaySession | None:
    """The replay session of `run`, or None when the run is not a replay."""
    row = replays.replay_of_run(ctx, run_id=run.id, caller=SYSTEM)
    if row is None:
        return None
    rec = load_recording(ctx, run_id=row.original_run_id, caller=SYSTEM)
    return ReplaySession(ctx, run=run, mode=row.mode, model=row.model, rec=rec)


class RecordedModel(ModelProvider):
    """The recorded model turns, in order, for an exact replay; each request must be the
    recorded conversation up to that turn."""

    def __init__(self, session: ReplaySession) -> None:
        self.session = session

    def complete(
        self,
        *,
        model: str,
        system: str,
        messages: list[dict[str, Any]],
        tools: list[dict[str, Any]],
        max_tokens: int,
        timeout: float,
        progress: TurnProgress | None = None,
    ) -> ModelReply:
        session, rec = self.session, self.session.rec
        if session.divergence is not None:
            raise ReplayDiverged(session.diverge("", None, None))
        k = session.turn
        if k >= len(rec.turns):
            ended = rec.error_message or f"the original run ended {rec.status} here"
            error = RecordingEnded(f"the recording ends after model turn {k}: {ended}")
            error.code = rec.error_code or RecordingEnded.code  # type: ignore[misc]
            raise error
        recorded = rec.messages[: rec.turn_starts[k]]
        if messages != recorded:
            at = next(
                (i for i, (a, b) in enumerate(zip(messages, recorded, strict=False)) if a != b),
                min(len(messages), len(recorded)),
            )
            raise ReplayDiverged(
                session.diverge(
                    f"model turn {k + 1} (message {at + 1})",
                    _clip(recorded[at] if at < len(recorded) else None),
                    _clip(messages[at] if at < len(messages) else None),
                )
            )
        session.turn += 1
        used = rec.turn_usage[k] if rec.turn_usage and k < len(rec.turn_usage) else (0, 0)
        return ModelReply(
            content=copy.deepcopy(rec.turns[k]),
            stop_reason=None,
            input_tokens=used[0],
            output_tokens=used[1],
        )


class RecordedAnswers:
    """Recorded calls looked up by tool and normalised arguments; a call answers once before
    it answers again (a model repeating itself gets the same recorded answer)."""

    def __init__(self, calls: list[RecordedCall]) -> None:
        self._by_key: dict[str, list[RecordedCall]] = {}
        self._used: set[str] = set()
        for call in calls:
            if call.name != "finish" and not call.content.startswith(UNKNOWN_TOOL_PREFIX):
                self._by_key.setdefault(_key(call.name, call.arguments), []).append(call)

    def find(self, name: str, args: dict[str, Any]) -> RecordedCall | None:
        found = self._by_key.get(_key(name, args)) or []
        fresh = [c for c in found if c.use_id not in self._used]
        if not found:
            return None
        call = (fresh or found)[0]
        self._used.add(call.use_id)
        return call


def _key(name: str, args: dict[str, Any]) -> str:
    return f"{name}\0{canonical(args)}"


def _answer_or_refuse(
    tool: Tool, matcher: RecordedAnswers, *, live: bool
) -> Callable[[dict[str, Any]], str]:
    def run(args: dict[str, Any]) -> str:
        call = matcher.find(tool.name, args)
        if call is not None:
            return _recorded_answer(call)
        if live:
            method = str(args.get("method") or "GET").upper()
            if tool.builtin == "http_request" and method not in READ_ONLY_METHODS:
                raise RecordedToolError(
                    f"{NOT_RECORDED}, and a replay sends only GET or HEAD requests live "
                    f"({method} refused)",
                    call_status=ToolCallStatus.REFUSED,
                )
            return tool.run(args)
        raise RecordedToolError(
            f"{NOT_RECORDED}: this replay answers tool calls from the original run's "
            f"recorded calls, and {tool.name} was not called there with these arguments. "
            "A replay never acts on the world; continue without it or finish.",
            call_status=ToolCallStatus.REFUSED,
        )

    return run


def _recorded_answer(call: RecordedCall) -> str:
    if call.is_error:
        raise RecordedToolError(call.content, call_status=call.status or ToolCallStatus.ERROR)
    return call.content


def _clip(value: Any) -> Any:
    text = json.dumps(value, default=str)
    return value if len(text) <= SHOWN else text[:SHOWN] + "..."
