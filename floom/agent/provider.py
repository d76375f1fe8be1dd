"""The model provider seam: one turn of a conversation with tools, and what it cost.

`ModelProvider.complete` sends the whole conversation and returns the model's reply as plain
content blocks (text and tool_use dicts, as the Messages API spells them) with token usage.
It raises ProviderError, marked retryable or not; it never returns a partial reply.
"""

from __future__ import annotations

import abc
import os
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from floom.errors import ProviderAuthFailed, ProviderError

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
    content: list[dict[str, Any]]
    stop_reason: str | None
    input_tokens: int
    output_tokens: int


class ModelProvider(abc.ABC):
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
    ) -> ModelReply: ...


def provider_key(settings: Settings) -> str:
    """The provider key: FLOOM_ANTHROPIC_API_KEY, else ANTHROPIC_API_KEY; "" when unset."""
    return settings.anthropic_api_key or os.environ.get("ANTHROPIC_API_KEY", "")


class AnthropicProvider(ModelProvider):
    """The Messages API through the `anthropic` SDK (non-streaming)."""

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
    ) -> ModelReply:
        import anthropic

        try:
            # Retries must fit in the time the run has left.
            client = self._client.with_options(max_retries=2 if timeout > 60 else 0)
            reply = client.messages.create(
                model=model,
                max_tokens=max_tokens,
                system=system,
                messages=messages,  # type: ignore[arg-type]
                tools=tools,  # type: ignore[arg-type]
                timeout=timeout,
            )
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
