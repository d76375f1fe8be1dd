"""What floom reads of a remote tool source (an MCP server, Composio): a third party's
server, so each answer is read uncompressed up to a bound, and of its tools only a bounded
number, with bounded descriptions and schemas, reach the model at every turn."""

from __future__ import annotations

import asyncio
import gzip
import json
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import pytest

from floom.agent.remote import (
    MAX_DESCRIPTION_CHARS,
    MAX_TOOLS_PER_SOURCE,
    composio_tools,
)
from floom.errors import SourceUnavailable
from floom.manifest.agent import ToolSpec
from floom.net.egress import AnswerTooLarge, EgressPolicy, guarded_async_client, guarded_client
from tests.standins.http import JSONHandler, serve

LOOPBACK = EgressPolicy(allow_private=True)


@contextmanager
def answering(routes: dict[str, tuple[bytes, dict[str, str]]]) -> Iterator[dict[str, Any]]:
    """A loopback server answering each path of `routes` with (body, headers); yields its
    "url" and the "accept" encodings each request asked for."""
    state: dict[str, Any] = {"accept": []}

    class Handler(JSONHandler):
        def do_GET(self) -> None:  # http.server's naming
            state["accept"].append(self.headers.get("Accept-Encoding"))
            body, headers = routes[self.path.split("?")[0]]
            self.send_response(200)
            for name, value in {"Content-Type": "application/json", **headers}.items():
                self.send_header(name, value)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

    with serve(Handler) as url:
        state["url"] = url
        yield state


def test_a_bounded_client_reads_an_answer_uncompressed_and_no_further_than_its_bound() -> None:
    big = b"x" * 5000
    routes = {
        "/small": (b'{"ok": true}', {}),
        "/big": (big, {}),
        "/gzip": (gzip.compress(b"{}"), {"Content-Encoding": "gzip"}),
    }
    with answering(routes) as peer:
        with guarded_client(LOOPBACK, max_answer_bytes=1000, base_url=peer["url"]) as client:
            small = client.get("/small").json()
            with pytest.raises(AnswerTooLarge, match="larger than 1000 bytes"):
                client.get("/big")
            with pytest.raises(AnswerTooLarge, match=r"compressed \(gzip\)"):
                client.get("/gzip")

        async def fetch() -> Any:
            async with guarded_async_client(
                LOOPBACK, max_answer_bytes=1000, base_url=peer["url"]
            ) as client:
                answer = (await client.get("/small")).json()
                with pytest.raises(AnswerTooLarge, match="larger than 1000 bytes"):
                    await client.get("/big")
                with pytest.raises(AnswerTooLarge, match="compressed"):
                    await client.get("/gzip")
                return answer

        small_async = asyncio.run(fetch())
        # Unbounded (the default), the same answer is read whole.
        with guarded_client(LOOPBACK, base_url=peer["url"]) as client:
            whole = client.get("/big").content

    assert small == small_async == {"ok": True}
    assert peer["accept"][:3] == ["identity"] * 3
    assert whole == big


def _composio(url: str, note: list[str]) -> list[Any]:
    spec = ToolSpec(
        source="composio", name="gmail", options={"app": "gmail", "allowed_tools": ["*"]}
    )
    return composio_tools(
        spec, base_url=url, api_key="k", timeout=10, note=note.append, egress=LOOPBACK
    )


def test_a_composio_listing_gives_the_model_bounded_tools_only() -> None:
    deep: dict[str, Any] = {"type": "object"}
    for _ in range(100):
        deep = {"type": "object", "properties": {"a": deep}}
    items: list[dict[str, Any]] = [
        {"slug": "WORDY", "description": "w" * 100_000, "input_parameters": {"type": "object"}},
        {"slug": "HUGE", "input_parameters": {"type": "object", "x": "y" * 200_000}},
        {"slug": "DEEP", "input_parameters": deep},
        {"slug": "LISTED", "input_parameters": ["not", "an", "object"]},
    ]
    items += [{"slug": f"T{n}", "description": "fine"} for n in range(300)]
    listing = json.dumps({"items": items}).encode()
    with answering({"/api/v3/tools": (listing, {})}) as peer:
        note: list[str] = []
        tools = _composio(peer["url"], note)

    names = [tool.name for tool in tools]
    assert len(tools) == MAX_TOOLS_PER_SOURCE
    assert names[0] == "WORDY"
    assert len(tools[0].description) == MAX_DESCRIPTION_CHARS
    assert not {"HUGE", "DEEP", "LISTED"} & set(names)
    told = "\n".join(note)
    for left_out in ("'HUGE' left out", "'DEEP' left out", "'LISTED' left out"):
        assert left_out in told, told
    assert f"offers 301 allowed tools; the first {MAX_TOOLS_PER_SOURCE} are kept" in told


def test_a_composio_listing_larger_than_floom_reads_makes_the_source_unavailable() -> None:
    listing = json.dumps({"items": [{"slug": "T", "description": "d" * (20 << 20)}]}).encode()
    with (
        answering({"/api/v3/tools": (listing, {})}) as peer,
        pytest.raises(SourceUnavailable, match="larger than 16777216 bytes"),
    ):
        _composio(peer["url"], [])
