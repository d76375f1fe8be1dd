"""The model provider seam: one turn of a conversation with tools, and what it cost.

The agent runner gets its provider from a factory that receives the settings
(`build_provider`, or the override a Context carries); the contract is `ModelProvider`'s.
"""

from __future__ import annotations

import abc
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Protocol

from floom.errors import ProviderAuthFailed, ProviderError, ProviderKeyMissing

if TYPE_CHECKING:
    from floom.config import Settings

KEY_SETTING = "FLOOM_ANTHROPIC_API_KEY"
# USD per million input and output tokens, longest matching model-name prefix first. An
# estimate: unknown models are priced like the default family.
PRICES: tuple[tuple[str, float, float], ...] = (
    ("claude-opus-4-5", 5.0, 25.0),
    ("claude-opus-4-1", 15.0, 75.0),
    ("claude-opus-4", 15.0, 75.0),
    ("claude-3-opus", 15.0, 75.0),
    ("claude-haiku-4", 1.0, 5.0),
    ("claude-3-5-haiku", 0.8, 4.0),
    ("claude-3-haiku", 0.25, 1.25),
    ("claude-sonnet", 3.0, 15.0),
    ("claude-3-7-sonnet", 3.0, 15.0),
    ("claude-3-5-sonnet", 3.0, 15.0),
)
DEFAULT_PRICE = (3.0, 15.0)


def estimate_cost(model: str, input_tokens: int, output_tokens: int) -> float:
    price_in, price_out = next(
        ((i, o) for prefix, i, o in PRICES if model.startswith(prefix)), DEFAULT_PRICE
    )
    return (input_tokens * price_in + output_tokens * price_out) / 1_000_000


@dataclass(frozen=True)
class ModelReply:
    """One whole model turn.

    `content` holds the reply's blocks in order, as plain dicts spelled as the Messages API
    spells them: `{"type": "text", "text": str}` and
    `{"type": "tool_use", "id": str, "name": str, "input": dict}` (ids unique within the
    conversation); other block kinds are left out. `stop_reason` is the provider's own
    ("tool_use", "end_turn", "max_tokens", ...), for the record only: the loop goes by the
    tool_use blocks. `input_tokens` and `output_tokens` are what this one turn was billed;
    the loop adds them up per run and prices them with `estimate_cost`.
    """

    content: list[dict[str, Any]]
    stop_reason: str | None
    input_tokens: int
    output_tokens: int


class TurnProgress(Protocol):
    """Told about a model turn while it arrives: pieces of its text in order, and the name of
    each tool call as the model starts it. Only for showing progress: the ModelReply that
    `complete` returns stays the whole truth of the turn."""

    def text(self, piece: str) -> None: ...

    def tool_call(self, name: str) -> None: ...


class ModelProvider(abc.ABC):
    """A model that answers one turn of a conversation with tools.

    `complete` sends the whole conversation: `system`, `messages` (Messages API shape: user
    and assistant turns; tool results are `tool_result` blocks in a user turn, with
    `is_error: true` for a failed call) and the `tools` the model may call (name,
    description, input_schema). `timeout` is the time the run has left, in seconds;
    `max_tokens` caps the reply's output tokens. It returns the whole reply as a ModelReply,
    never a partial one, and must not keep or change `messages` (the loop extends that list
    after each turn). Any failure is a ProviderError whose `retryable` says whether the same
    request may succeed later (rate limits, overload, a lost connection, a timeout) or not
    (a refused key, ProviderAuthFailed; a malformed request). The loop ends the attempt on
    it; the worker's retry policy decides about another attempt, which resumes from the
    stored transcript without repeating answered tool calls. A provider that streams tells
    `progress` (when given) about the turn as it arrives; one that does not may ignore it.
    """

    @abc.abstractmethod
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
    ) -> ModelReply: ...


ProviderFactory = Callable[["Settings"], ModelProvider]
"""Builds the provider agent runs on this node talk to; raises ProviderError (ProviderKeyMissing
when no key is set) when it cannot."""


def provider_key(settings: Settings) -> str:
    """The provider key: FLOOM_ANTHROPIC_API_KEY, else ANTHROPIC_API_KEY; "" when unset."""
    return settings.model_key


def build_provider(settings: Settings) -> ModelProvider:
    """The provider the settings configure: the Messages API with the provider key, at
    FLOOM_ANTHROPIC_BASE_URL when set. Raises ProviderKeyMissing when no key is set."""
    key = provider_key(settings)
    if not key:
        raise ProviderKeyMissing(
            f"no model provider key: set {KEY_SETTING} (or ANTHROPIC_API_KEY) in the "
            "environment of the floom server that runs agents"
        )
    return AnthropicProvider(api_key=key, base_url=settings.anthropic_base_url or None)


class AnthropicProvider(ModelProvider):
    """The Messages API through the `anthropic` SDK, streamed so a run shows the model's
    text and tool calls as they arrive."""

    def __init__(self, *, api_key: str, base_url: str | None = None) -> None:
        import anthropic

        self._client = anthropic.Anthropic(api_key=api_key, base_url=base_url or None)

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
        import anthropic

        try:
            # Retries must fit in the time the run has left.
            client = self._client.with_options(max_retries=2 if timeout > 60 else 0)
            with client.messages.stream(
                model=model,
                max_tokens=max_tokens,
                system=system,
                messages=messages,  # type: ignore[arg-type]
                tools=tools,  # type: ignore[arg-type]
                timeout=timeout,
            ) as stream:
                for event in stream:
                    if progress is None:
                        continue
                    if event.type == "text":
                        progress.text(event.text)
                    elif (
                        event.type == "content_block_start"
                        and event.content_block.type == "tool_use"
                    ):
                        progress.tool_call(event.content_block.name)
                    elif event.type == "content_block_stop" and event.content_block.type == "text":
                        progress.text("\n")  # a text block's last line is whole
                reply = stream.get_final_message()
        except anthropic.AuthenticationError as exc:
            raise ProviderAuthFailed(
                f"the model provider refused the key ({exc.status_code}); check {KEY_SETTING}"
            ) from exc
        except anthropic.APIStatusError as exc:
            retryable = exc.status_code == 429 or exc.status_code >= 500
            raise ProviderError(
                f"the model provider answered {exc.status_code}: {_message_of(exc)}",
                retryable=retryable,
            ) from exc
        except anthropic.APIConnectionError as exc:  # includes timeouts
            raise ProviderError(
                f"cannot reach the model provider: {type(exc).__name__}", retryable=True
            ) from exc
        content: list[dict[str, Any]] = []
        for block in reply.content:
            if block.type == "text":
                content.append({"type": "text", "text": block.text})
            elif block.type == "tool_use":
                content.append(
                    {"type": "tool_use", "id": block.id, "name": block.name, "input": block.input}
                )
        usage = reply.usage
        return ModelReply(
            content=content,
            stop_reason=reply.stop_reason,
            input_tokens=int(usage.input_tokens or 0),
            output_tokens=int(usage.output_tokens or 0),
        )


def _message_of(exc: Any) -> str:
    body = getattr(exc, "body", None)
    if isinstance(body, dict):
        error = body.get("error")
        if isinstance(error, dict) and error.get("message"):
            return str(error["message"])[:300]
    return str(exc)[:300]
