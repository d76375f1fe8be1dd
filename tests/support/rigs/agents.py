"""Helpers for the approval and agent tests: waiting on the new run states, agent workers."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx

from floom.bundle import read_folder
from floom.engine.runtime import NodeRuntime
from floom.services.access.principal import SYSTEM
from floom.services.context import Context
from floom.services.runs.rules import FINISHED
from floom.services.workers import versions
from tests.standins.anthropic_api import MessagesStandin, messages_standin
from tests.standins.echo import echo_service
from tests.support.harness import (
    LiveServer,
    deploy_folder,
    live_server,
    make_worker,
    wait_until,
)
from tests.support.rigs.fake_provider import FakeProvider, call, finish


def wait_status(
    api: httpx.Client, run_id: str, statuses: set[str] | None = None, *, timeout: float = 30
) -> dict[str, Any]:
    """Poll the run until its status is one of `statuses` (default: any end state). A run
    that ends otherwise fails the wait at once, with the run and its log: it never moves
    again."""
    wanted = statuses or FINISHED

    def reached() -> dict[str, Any] | None:
        body: dict[str, Any] = api.get(f"/api/v1/runs/{run_id}").json()
        if body["status"] in FINISHED and body["status"] not in wanted:
            raise AssertionError(
                f"run {run_id} ended {body['status']}, not {sorted(wanted)}: {body}\n"
                + "\n".join(log_lines(api, run_id))
            )
        return body if body["status"] in wanted else None

    try:
        result: dict[str, Any] = wait_until(reached, timeout=timeout)
    except AssertionError as exc:
        if "not met within" not in str(exc):
            raise
        body = api.get(f"/api/v1/runs/{run_id}").json()
        raise AssertionError(
            f"run {run_id} is still {body['status']} after {timeout}s, not {sorted(wanted)}: "
            f"{body}\n" + "\n".join(log_lines(api, run_id))
        ) from None
    return result


def log_lines(api: httpx.Client, run_id: str) -> list[str]:
    return [e["line"] for e in api.get(f"/api/v1/runs/{run_id}/logs").json()["items"]]


def start_run(api: httpx.Client, worker: str, inputs: dict[str, Any] | None = None) -> str:
    resp = api.post(f"/api/v1/workers/{worker}/runs", json={"inputs": inputs or {}})
    assert resp.status_code == 202, resp.text
    run_id: str = resp.json()["id"]
    return run_id


MODEL_KEY = "sk-ant-standin-key-0123456789"


@dataclass
class AgentRig:
    """A floom server whose agents talk to the Messages stand-in, and a local HTTP service
    reachable as api.example.test (private addresses allowed unless said otherwise)."""

    model: MessagesStandin
    echo: dict[str, Any]
    server: LiveServer
    api: httpx.Client

    def url(self, path: str) -> str:
        return f"http://api.example.test:{self.echo['port']}{path}"

    def deploy(self, folder: Path) -> None:
        deploy_folder(self.api, folder)


@contextmanager
def agent_rig(
    data_dir: Path,
    database_url: str,
    *,
    model: MessagesStandin | None = None,
    echo: dict[str, Any] | None = None,
    **overrides: Any,
) -> Iterator[AgentRig]:
    settings: dict[str, Any] = {
        "anthropic_api_key": MODEL_KEY,
        "agent_http_allow_private": True,
        "agent_http_resolve": "api.example.test=127.0.0.1",
    }
    settings.update(overrides)
    with ExitStack() as stack:
        if model is None:
            model = stack.enter_context(messages_standin(MODEL_KEY))
        settings.setdefault("anthropic_base_url", model.url)
        if echo is None:
            echo = stack.enter_context(echo_service())
        srv = stack.enter_context(live_server(data_dir, database_url, **settings))
        api = stack.enter_context(srv.client())
        yield AgentRig(model=model, echo=echo, server=srv, api=api)


def agent_worker(folder: Path, manifest: str, skill: str = "Do the task.", **files: str) -> Path:
    return make_worker(folder, manifest, {"SKILL.md": skill, **files})


def notes_agent(ctx: Context, folder: Path) -> FakeProvider:
    """An agent worker `agent` deployed on `ctx` (made in `folder`) whose scripted model
    writes notes.md (3,000 characters), reads it back, then finishes: a whole agent run
    with two tool calls and an artifact, for an executor started on `ctx`."""
    model = FakeProvider()
    NodeRuntime.of(ctx).provider_factory = model.factory
    worker = make_worker(
        folder,
        "name: agent\ntools: [{builtin: write_file}, {builtin: read_file}]\n",
        {"SKILL.md": "Write notes.md, read it back, then finish.\n"},
    )
    versions.deploy(ctx, caller=SYSTEM, archive=read_folder(worker, max_bytes=1 << 20).to_archive())
    model.script(
        call("write_file", {"path": "notes.md", "content": "notes " * 500}),
        call("read_file", {"path": "output/notes.md"}),
        finish({}),
    )
    return model
