"""One attempt of an agent run: check the provider key and secrets, prepare the workspace,
assemble the allowed tools, then hand over to the loop (a new transcript or the stored one)."""

from __future__ import annotations

import json
import os
import time
from dataclasses import replace
from pathlib import Path
from typing import TYPE_CHECKING

from floom import jsonvalues
from floom.agent import workspace
from floom.agent.builtin import AgentEnv, finish_tool, make_builtin, state_tool
from floom.agent.loop import AgentLoop
from floom.agent.provider import ModelProvider, build_provider, provider_key
from floom.agent.remote import composio_tools, mcp_tools
from floom.agent.replay import replay_session
from floom.agent.tools import Tool, Toolbox
from floom.engine.queue import Outcome
from floom.engine.runtime import NodeRuntime
from floom.errors import (
    LimitExceeded,
    ProviderError,
    RunErrorCode,
    SourceUnavailable,
    run_error_code,
)
from floom.manifest.agent import ToolSpec, tool_specs
from floom.manifest.schema import MAX_SKILL_BYTES
from floom.net.egress import RELAXED_WARNING
from floom.services.access.principal import SYSTEM
from floom.services.runs import agent as agent_runs
from floom.services.runs.approvals import PHASE_APPLY
from floom.services.runs.rules import FAILED
from floom.store.agents import Transcript

if TYPE_CHECKING:
    from floom.engine.attempt import Attempt

REMOTE_TIMEOUT = 60.0


def run_agent(attempt: Attempt) -> Outcome:
    ctx, run, manifest, run_log = attempt.ctx, attempt.run, attempt.manifest, attempt.run_log
    settings = ctx.settings
    build = NodeRuntime.of(ctx).provider_factory or build_provider
    # A replay of a recorded run: exact calls neither the model nor a tool (agent/replay.py).
    session = replay_session(ctx, run=run)
    try:
        provider: ModelProvider = session.provider(build) if session else build(settings)
    except ProviderError as exc:
        return Outcome(
            status=FAILED,
            error_code=run_error_code(exc),
            error_message=exc.message,
            retryable=exc.retryable,
        )
    key = provider_key(settings)
    specs = tool_specs(manifest)
    remote_needed = session is None or not session.exact
    if (
        remote_needed
        and any(s.source == "composio" for s in specs)
        and not settings.composio_api_key
    ):
        return Outcome(
            status=FAILED,
            error_code=RunErrorCode.COMPOSIO_KEY_MISSING,
            error_message="this worker uses Composio tools: set FLOOM_COMPOSIO_API_KEY in the "
            "environment of the floom server",
            retryable=False,
        )
    apply = run.phase == PHASE_APPLY
    names = [*manifest.secrets, *(manifest.apply_secrets if apply else [])]
    auth_names = [str(s.options["auth_secret"]) for s in specs if s.options.get("auth_secret")]
    ended = attempt.resolve_secrets(
        [*names, *auth_names], also_redact=[key, settings.composio_api_key]
    )
    if ended is not None:
        return ended
    values, redactor = attempt.secrets, attempt.redactor
    # One sandbox session serves the run's commands; it ends when the run ends or pauses
    # (the workspace is kept in the store then, and restored into the next session).
    with attempt.workspace(), attempt.session():
        transcript = agent_runs.load_transcript(ctx, run_id=run.id, caller=SYSTEM)
        stored = transcript is not None
        if transcript is not None:
            attempt.restore_artifacts()
            if transcript.workspace_digest:
                workspace.restore(
                    ctx,
                    run_id=run.id,
                    digest=transcript.workspace_digest,
                    base=attempt.base,
                    note=lambda line: run_log.add("system", line),
                )
            run_log.add("system", f"resuming the agent after model turn {transcript.iterations}")
        spent = transcript.active_seconds if transcript else 0.0
        attempt.deadline = time.monotonic() + manifest.limits.timeout_seconds - spent
        env = AgentEnv(
            attempt=attempt,
            secrets={n: values[n] for n in names},
            deadline=attempt.deadline,
            apply=apply,
        )
        try:
            if session is None:
                toolbox = _toolbox(env, specs, values)
            else:
                toolbox = session.toolbox(env, lambda: _toolbox(env, specs, values))
        except SourceUnavailable as exc:
            return Outcome(
                status=FAILED,
                error_code=RunErrorCode.TOOL_SOURCE_UNAVAILABLE,
                error_message=redactor.text(str(exc)),
            )
        if transcript is None and session is not None and session.exact:
            transcript = session.exact_transcript()
            # No tool runs in an exact replay, so nothing would write the files the
            # original's tools left: the replay ends with the original's artifacts.
            attempt.restore_artifacts(of_run=session.rec.run_id)
        elif transcript is None:
            also_gated = frozenset(session.gated if session else ())
            try:
                transcript = _new_transcript(env, toolbox, also_gated)
            except LimitExceeded as exc:
                return Outcome(
                    status=FAILED,
                    error_code=RunErrorCode.LIMIT_EXCEEDED,
                    error_message=redactor.text(str(exc)),
                )
            if session is not None and session.model:
                transcript.model = session.model
        loop = AgentLoop(
            env,
            transcript=transcript,
            toolbox=toolbox,
            provider=provider,
            replay=session is not None,
            stored=stored,
        )
        outcome = loop.run()
        # As its last step left it (saved, or left to the end to save: `transcript_unsaved`):
        # with object storage its text goes into the log's object at the end.
        outcome.transcript = loop.t
        outcome.transcript_unsaved = loop.unsaved
        outcome.sandbox_seconds = outcome.sandbox_seconds or env.sandbox_seconds
        outcome = attempt.with_state(outcome)
        if session is not None and outcome.state is not None:
            # A replay from a recording acts on nothing: it reads its original's state and
            # leaves none.
            outcome.state = replace(outcome.state, new_json=None)
        return outcome


def _toolbox(env: AgentEnv, specs: list[ToolSpec], values: dict[str, str]) -> Toolbox:
    settings = env.ctx.settings
    timeout = max(1.0, min(REMOTE_TIMEOUT, env.remaining()))

    def note(text: str) -> None:
        env.run_log.add("system", text)

    egress = env.egress
    if egress.relaxed_for_tests and any(
        s.source != "builtin" or s.builtin == "http_request" for s in specs
    ):
        note(RELAXED_WARNING)
    tools: list[Tool] = []
    for spec in specs:
        if spec.source == "builtin":
            if spec.builtin != "finish":
                tools.append(make_builtin(spec, env))
        elif spec.source == "mcp":
            secret = spec.options.get("auth_secret")
            token = values.get(str(secret)) if secret else None
            tools.extend(mcp_tools(spec, token=token, timeout=timeout, note=note, egress=egress))
        else:
            tools.extend(
                composio_tools(
                    spec,
                    base_url=settings.composio_base_url,
                    api_key=settings.composio_api_key,
                    timeout=timeout,
                    note=note,
                    egress=egress,
                )
            )
    if env.manifest.state.enabled:
        tools.append(state_tool(env))
    tools.append(finish_tool(env.manifest))
    toolbox = Toolbox(tools)
    for tool in toolbox.dropped:
        note(f"{tool.source} tool '{tool.name}' not offered: another tool has that name")
    return toolbox


def _read_skill(path: Path) -> str:
    """An agent's SKILL.md, read no further than MAX_SKILL_BYTES and without following a
    link: deploys refuse a larger one, but a version stored before that bound may hold one."""
    fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW)
    with os.fdopen(fd, "rb") as f:
        data = f.read(MAX_SKILL_BYTES + 1)
    if len(data) > MAX_SKILL_BYTES:
        raise LimitExceeded(
            f"{path.name} is more than {MAX_SKILL_BYTES // 1024} KiB, more than an agent's "
            "instructions may hold",
            hint="shorten SKILL.md (put reference material in files beside it) and deploy again",
        )
    return data.decode("utf-8", errors="replace")


def _new_transcript(
    env: AgentEnv, toolbox: Toolbox, also_gated: frozenset[str] = frozenset()
) -> Transcript:
    manifest, run = env.manifest, env.run
    skill = _read_skill(env.workdir / manifest.entry)
    outputs = ", ".join(
        f"{name} ({spec.type}{', required' if spec.required else ''})"
        for name, spec in manifest.outputs.items()
    )
    notes = [
        f'You are the floom worker "{manifest.name}", run {run.id}. Use only the tools you are '
        "given; every call is recorded.",
        'End the run by calling finish with {"outputs": {...}}. Declared outputs: '
        + (outputs or "none (pass an empty object or any values)")
        + ".",
        "The workspace holds the worker's files; files saved under output/ become the run's "
        "artifacts.",
    ]
    if manifest.approvals.get("required"):
        notes.append(
            "A person reviews your outputs: after finish the run waits for their decision. If "
            "they approve, you continue in an apply phase to carry out what was approved."
        )
    # A what-if replay's toolbox answers gated tools from the recording (never asking a
    # person), but the model reads the same instructions as in a run.
    gated = [t.name for t in toolbox.tools() if t.gated or t.name in also_gated]
    if gated:
        notes.append(
            f"These tools wait for a person's approval before they run: {', '.join(gated)}. "
            "A rejected call comes back to you with the reason."
        )
    system = skill.strip() + "\n\n---\nHow this run works:\n" + "\n".join(f"- {n}" for n in notes)
    inputs = jsonvalues.stored(run.inputs_json, expect=dict)
    first = (
        f"The run's inputs (JSON):\n{json.dumps(inputs, indent=2)}\n\n"
        "Do the task your instructions describe, then call finish."
    )
    return Transcript(
        run_id=run.id,
        worker_name=run.worker_name,
        model=manifest.model or env.ctx.settings.model,
        system=system,
        messages_json=json.dumps([{"role": "user", "content": first}]),
        state_json=json.dumps({"tool_names": toolbox.names(), "gated_tools": gated}),
    )
