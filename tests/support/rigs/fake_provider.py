"""An in-memory model provider for agent-loop tests: scripted replies, every request recorded,
no HTTP. The Messages stand-in (tests/standins/anthropic_api.py) is what proves the real SDK
path; this double is for what the loop does with the replies.

Put it into a run with `NodeRuntime.of(ctx).provider_factory = fake.factory`.
"""

from __future__ import annotations

import copy
import itertools
import threading
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any

from floom.agent.provider import ModelProvider, ModelReply
from floom.config import Settings
from floom.errors import ProviderError

Responder = Callable[[list[dict[str, Any]], list[dict[str, Any]]], ModelReply]
"""Called with (messages, tools) of a request; returns the reply or raises ProviderError."""
Step = ModelReply | ProviderError | Responder

_ids = itertools.count(1)


def text(value: str) -> dict[str, Any]:
    return {"type": "text", "text": value}


def tool_use(name: str, arguments: dict[str, Any] | None = None) -> dict[str, Any]:
    """A tool_use block with an id unique in this test process."""
    return {
        "type": "tool_use",
        "id": f"toolu_fake_{next(_ids):06d}",
        "name": name,
        "input": arguments or {},
    }


def reply(
    *blocks: dict[str, Any] | str, input_tokens: int = 100, output_tokens: int = 20
) -> ModelReply:
    """One model turn of the given blocks (a str is a text block); the stop reason follows
    from them as the Messages API sets it."""
    content = [text(b) if isinstance(b, str) else b for b in blocks]
    calls = any(b["type"] == "tool_use" for b in content)
    return ModelReply(
        content=content,
        stop_reason="tool_use" if calls else "end_turn",
        input_tokens=input_tokens,
        output_tokens=output_tokens,
    )


def call(name: str, arguments: dict[str, Any] | None = None, **usage: int) -> ModelReply:
    """A turn that calls one tool."""
    return reply(tool_use(name, arguments), **usage)


def finish(outputs: dict[str, Any] | None = None, **usage: int) -> ModelReply:
    """The turn that ends the run: a call to `finish` with these outputs."""
    return call("finish", {"outputs": outputs or {}}, **usage)


@dataclass(frozen=True)
class Request:
    """What the loop sent in one `complete` call (a deep copy: the loop keeps extending its
    message list after the call)."""

    model: str
    system: str
    messages: list[dict[str, Any]]
    tools: list[dict[str, Any]]
    max_tokens: int
    timeout: float

    @property
    def tool_names(self) -> list[str]:
        return [t["name"] for t in self.tools]

    @property
    def tool_results(self) -> list[dict[str, Any]]:
        """The tool_result blocks of the last user turn."""
        content = self.messages[-1]["content"]
        if not isinstance(content, list):
            return []
        return [b for b in content if isinstance(b, dict) and b.get("type") == "tool_result"]


class FakeProvider(ModelProvider):
    """Answers each request with the next step of its script: a ModelReply is returned, a
    ProviderError is raised, a Responder is called with the request's messages and tools.
    A request past the end of the script fails with a non-retryable ProviderError that says
    so, as the run's error."""

    def __init__(self, script: Iterable[Step] = ()) -> None:
        self._script: list[Step] = list(script)
        self._lock = threading.Lock()
        self.requests: list[Request] = []
        self.built_with: list[Settings] = []

    def script(self, *steps: Step) -> None:
        with self._lock:
            self._script.extend(steps)

    @property
    def remaining(self) -> int:
        with self._lock:
            return len(self._script)

    def factory(self, settings: Settings) -> ModelProvider:
        """A ProviderFactory that hands out this provider (for NodeRuntime.provider_factory,
        floom/engine/runtime.py)."""
        self.built_with.append(settings)
        return self

    def complete(
        self,
        *,
        model: str,
        system: str,
        messages: list[dict[str, Any]],
        tools: list[dict[str, Any]],
        max_tokens: int,
        timeout: float,
        progress: Any = None,
    ) -> ModelReply:
        request = Request(
            model=model,
            system=system,
            messages=copy.deepcopy(messages),
            tools=copy.deepcopy(tools),
            max_tokens=max_tokens,
            timeout=timeout,
        )
        with self._lock:
            self.requests.append(request)
            step = self._script.pop(0) if self._script else None
        if step is None:
            raise ProviderError(
                f"the fake provider has no reply scripted for request {len(self.requests)}"
            )
        if isinstance(step, ProviderError):
            raise step
        if isinstance(step, ModelReply):
            return step
        return step(request.messages, request.tools)
