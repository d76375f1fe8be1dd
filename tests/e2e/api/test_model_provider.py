"""The ModelProvider contract held by the real provider (the anthropic SDK against the
Messages stand-in on loopback), and the fake provider's replies shaped exactly like it."""

from __future__ import annotations

import copy
from collections.abc import Iterator
from typing import Any

import pytest

from floom.agent.provider import AnthropicProvider, ModelReply
from floom.errors import ProviderAuthFailed, ProviderError
from tests.standins.anthropic_api import MessagesStandin, failure, messages_standin, reply, text
from tests.support.harness import free_port
from tests.support.rigs import fake_provider

KEY = "sk-ant-standin-key-provider"
MESSAGES: list[dict[str, Any]] = [{"role": "user", "content": "Add 2 and 3."}]
TOOLS = [{"name": "add", "description": "Adds.", "input_schema": {"type": "object"}}]


@pytest.fixture(scope="module")
def server() -> Iterator[MessagesStandin]:
    with messages_standin(KEY) as s:
        yield s


@pytest.fixture
def standin(server: MessagesStandin) -> MessagesStandin:
    """The module's stand-in, with no request seen and nothing scripted."""
    server.requests.clear()
    assert server.remaining == 0, "a test left scripted replies unused"
    return server


def _complete(provider: AnthropicProvider, *, timeout: float = 30.0) -> ModelReply:
    # Up to 60 s the provider makes one try: errors reach the caller as they are.
    return provider.complete(
        model="claude-sonnet-4-5",
        system="You add.",
        messages=MESSAGES,
        tools=TOOLS,
        max_tokens=64,
        timeout=timeout,
    )


def test_a_reply_comes_back_whole_in_the_shape_the_fake_provider_builds(
    standin: MessagesStandin,
) -> None:
    use = {"type": "tool_use", "id": "toolu_1", "name": "add", "input": {"a": 2, "b": 3}}
    standin.script(reply(text("Adding."), use, input_tokens=31, output_tokens=7))
    before = copy.deepcopy(MESSAGES)

    got = _complete(AnthropicProvider(api_key=KEY, base_url=standin.url))

    assert got == fake_provider.reply("Adding.", use, input_tokens=31, output_tokens=7)
    assert got.stop_reason == "tool_use"
    assert before == MESSAGES
    (sent,) = standin.requests
    assert (sent["max_tokens"], sent["system"], sent["tools"]) == (64, "You add.", TOOLS)


@pytest.mark.parametrize(
    ("status", "retryable"),
    [(429, True), (500, True), (529, True), (400, False), (404, False)],
)
def test_a_provider_failure_is_a_provider_error_saying_whether_a_retry_may_help(
    standin: MessagesStandin, status: int, retryable: bool
) -> None:
    standin.script(failure(status, "no luck"))
    with pytest.raises(ProviderError) as raised:
        _complete(AnthropicProvider(api_key=KEY, base_url=standin.url))

    assert raised.value.retryable is retryable
    assert raised.value.code == "model_error"
    assert raised.value.message == f"the model provider answered {status}: no luck"
    assert len(standin.requests) == 1


def test_a_refused_key_is_provider_auth_failed_and_not_retryable(
    standin: MessagesStandin,
) -> None:
    with pytest.raises(ProviderAuthFailed) as raised:
        _complete(AnthropicProvider(api_key="sk-ant-wrong", base_url=standin.url))

    assert (raised.value.code, raised.value.retryable) == ("provider_auth", False)
    assert "FLOOM_ANTHROPIC_API_KEY" in raised.value.message
    assert "sk-ant-wrong" not in raised.value.message


def test_an_unreachable_provider_is_a_retryable_provider_error() -> None:
    closed = f"http://127.0.0.1:{free_port()}"
    with pytest.raises(ProviderError) as raised:
        _complete(AnthropicProvider(api_key=KEY, base_url=closed))

    assert raised.value.retryable is True
    assert raised.value.message.startswith("cannot reach the model provider")


def test_with_time_to_spare_a_passing_failure_is_retried_inside_complete(
    standin: MessagesStandin,
) -> None:
    standin.script(failure(529, "overloaded"), reply(text("5")))

    got = _complete(AnthropicProvider(api_key=KEY, base_url=standin.url), timeout=120)

    assert got.content == [{"type": "text", "text": "5"}]
    assert len(standin.requests) == 2
