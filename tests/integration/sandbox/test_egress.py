"""The egress guard (floom/net/egress.py) over every connection floom makes on a worker's behalf:
an agent's http_request, its MCP tool sources, Composio calls, run callbacks and alert
channels. Each source is shown refused where it must be, with nothing sent; a failure is told
without what the other end answered. Traffic goes to loopback stand-ins and to test hosts in
network namespaces the tests create (tests/support/processes/netns.py), nowhere else."""

from __future__ import annotations

import asyncio
import ipaddress
import json
import socket
import sys
import textwrap
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest

from floom.config import Settings
from floom.net.addresses import host_networks
from floom.net.egress import (
    DESCRIBE_LIMIT,
    EgressPolicy,
    EgressRefused,
    guarded_async_client,
    guarded_client,
    parse_allowed_networks,
    refusal,
    resolve_checked,
)
from tests.standins.anthropic_api import reply, tool_use
from tests.standins.composio import composio_standin
from tests.standins.http import STOP_POLL_SECONDS
from tests.standins.mcp_tracker import tracker_server
from tests.support.harness import wait_until
from tests.support.processes.netns import (
    NamespaceHost,
    host_wide_listener,
    namespace_host,
    needs_netns,
)
from tests.support.rigs.agents import agent_rig, agent_worker, start_run, wait_status

GUARDED: dict[str, Any] = {"agent_http_allow_private": False}


def _mcp_worker(folder: Path, url: str) -> Path:
    return agent_worker(
        folder,
        f"""\
name: {folder.name}
tools:
  - mcp: {{name: tracker, url: "{url}", auth_secret: TRACKER_TOKEN, allowed_tools: ["*"]}}
""",
    )


# -- MCP tool sources --------------------------------------------------------------------------


def test_an_mcp_source_on_the_hosts_loopback_gets_no_request_and_no_secret(
    tmp_path: Path, database_url: str
) -> None:
    token = "trk-token-loopback-4711"
    with (
        tracker_server(token) as tracker,
        agent_rig(
            tmp_path / "data",
            database_url,
            agent_http_allow_private=False,
            agent_http_resolve="tracker.test=127.0.0.1",
        ) as rig,
    ):
        port = tracker["url"].rsplit(":", 1)[1].split("/")[0]
        runs = {}
        for name, url in {
            "by-name": f"http://tracker.test:{port}/mcp",
            "by-address": tracker["url"],
            "by-mapped-address": f"http://[::ffff:127.0.0.1]:{port}/mcp",
        }.items():
            rig.deploy(_mcp_worker(tmp_path / name, url))
            rig.api.put("/api/v1/secrets/TRACKER_TOKEN", json={"value": token})
            runs[name] = wait_status(rig.api, start_run(rig.api, name))

    for name, run in runs.items():
        assert run["status"] == "failed", (name, run)
        assert run["error"]["code"] == "tool_source_unavailable"
        assert "a loopback address" in run["error"]["message"], (name, run["error"])
    assert tracker["auth"] == []
    assert tracker["calls"] == []


@contextmanager
def _answering(body: bytes, content_type: str) -> Iterator[int]:
    """A loopback service that answers every request with `body`."""

    class Handler(BaseHTTPRequestHandler):
        def do_POST(self) -> None:  # http.server's naming
            self.send_response(200)
            self.send_header("Content-Type", content_type)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        do_GET = do_DELETE = do_POST  # http.server's naming

        def log_message(self, *args: Any) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=server.serve_forever, args=(STOP_POLL_SECONDS,), daemon=True)
    thread.start()
    try:
        yield server.server_address[1]
    finally:
        server.shutdown()
        server.server_close()


def test_a_failing_mcp_source_is_told_without_what_it_answered(
    tmp_path: Path, database_url: str
) -> None:
    # What a service that is no MCP server answers (here: a JSON document of its own) must
    # not come back through the run's error, where whoever reads the run would read it.
    leaked = "internal-only-answer-" + "x" * 40
    answer = json.dumps({"service": leaked, "rows": [leaked] * 50}).encode()
    with (
        _answering(answer, "application/json") as port,
        agent_rig(tmp_path / "data", database_url) as rig,
    ):
        rig.deploy(_mcp_worker(tmp_path / "nosy", f"http://127.0.0.1:{port}/mcp"))
        rig.api.put("/api/v1/secrets/TRACKER_TOKEN", json={"value": "trk-token-99"})
        run = wait_status(rig.api, start_run(rig.api, "nosy"))

    assert run["status"] == "failed", run
    assert run["error"]["code"] == "tool_source_unavailable"
    message = run["error"]["message"]
    assert "internal" not in message, message
    assert "service" not in message, message
    assert "MCP server 'tracker' cannot list its tools" in message
    assert len(message) < DESCRIBE_LIMIT + 100


# -- Composio ----------------------------------------------------------------------------------


def test_composio_on_a_loopback_address_gets_no_request_and_no_key(
    tmp_path: Path, database_url: str
) -> None:
    composio_key = "cmp-key-guarded-77"
    with (
        composio_standin(composio_key) as composio,
        agent_rig(
            tmp_path / "data",
            database_url,
            composio_api_key=composio_key,
            composio_base_url=composio["url"],
            **GUARDED,
        ) as rig,
    ):
        rig.deploy(
            agent_worker(
                tmp_path / "mailer",
                "name: mailer\ntools:\n"
                "  - composio: {app: gmail, allowed_tools: [GMAIL_SEND_EMAIL]}\n",
            )
        )
        run = wait_status(rig.api, start_run(rig.api, "mailer"))

    assert run["status"] == "failed", run
    assert run["error"]["code"] == "tool_source_unavailable"
    assert "a loopback address" in run["error"]["message"]
    assert composio["keys"] == []


def test_a_composio_tool_slug_stays_one_segment_of_composios_path(
    tmp_path: Path, database_url: str
) -> None:
    composio_key = "cmp-key-slug-88"
    with (
        composio_standin(composio_key) as composio,
        agent_rig(
            tmp_path / "data",
            database_url,
            composio_api_key=composio_key,
            composio_base_url=composio["url"],
        ) as rig,
    ):
        rig.deploy(
            agent_worker(
                tmp_path / "climber",
                "name: climber\ntools:\n"
                "  - composio: {app: gmail, allowed_tools: ['../../../admin/keys?all=1']}\n",
            )
        )
        rig.model.script(reply(tool_use("finish", {"outputs": {}})))
        run = wait_status(rig.api, start_run(rig.api, "climber"))

    assert run["status"] == "succeeded", run
    assert composio["paths"] == ["/api/v3/tools/..%2F..%2F..%2Fadmin%2Fkeys%3Fall%3D1"]


# -- http_request, and the host's own addresses outside the private ranges ---------------------

# Runs in the test host's namespace: answers /redirect with a redirect to `to`, else "inside".
_NAMESPACE_SERVER = textwrap.dedent(
    """
    import sys
    from http.server import BaseHTTPRequestHandler, HTTPServer
    from urllib.parse import parse_qs, urlparse

    class Handler(BaseHTTPRequestHandler):
        def do_GET(self):
            query = parse_qs(urlparse(self.path).query)
            if "to" in query:
                self.send_response(302)
                self.send_header("Location", query["to"][0])
                self.send_header("Content-Length", "0")
                self.end_headers()
                return
            self.send_response(200)
            self.send_header("Content-Length", "6")
            self.end_headers()
            self.wfile.write(b"inside")

        def log_message(self, *args):
            pass

    HTTPServer((sys.argv[1], int(sys.argv[2])), Handler).serve_forever()
    """
)


@contextmanager
def _namespace_server(host: NamespaceHost, port: int) -> Iterator[None]:
    server = host.popen([sys.executable, "-c", _NAMESPACE_SERVER, host.address, str(port)])

    def up() -> bool:
        try:
            socket.create_connection((host.address, port), timeout=1).close()
            return True
        except OSError:
            return False

    try:
        wait_until(up, timeout=10)
        yield
    finally:
        server.kill()
        server.wait(10)


@needs_netns
def test_http_request_never_reaches_the_hosts_own_addresses_even_in_an_allowed_network(
    tmp_path: Path, database_url: str
) -> None:
    with namespace_host(public=True) as test_host, host_wide_listener() as (port, peers):
        inside_port = port + 1 if port < 65535 else port - 1
        with (
            _namespace_server(test_host, inside_port),
            agent_rig(
                tmp_path / "data",
                database_url,
                agent_http_allow_private=False,
                # The operator opens the test host's network: the host's own end of it (the
                # veth address in the root namespace) stays closed.
                egress_allow=test_host.network,
                agent_http_resolve=(
                    f"inside.test={test_host.address},hostside.test={test_host.outer_address}"
                ),
            ) as rig,
        ):
            rig.deploy(
                agent_worker(
                    tmp_path / "probe",
                    "name: probe\ntools:\n  - builtin: http_request\n"
                    "    allow_domains: [inside.test, hostside.test]\n",
                )
            )
            hostside = f"http://hostside.test:{port}/"
            rig.model.script(
                reply(
                    tool_use("http_request", {"url": f"http://inside.test:{inside_port}/"}),
                    tool_use("http_request", {"url": hostside}),
                    tool_use(
                        "http_request",
                        {"url": f"http://inside.test:{inside_port}/?to={hostside}"},
                    ),
                ),
                reply(tool_use("finish", {"outputs": {}})),
            )
            run = wait_status(rig.api, start_run(rig.api, "probe"))

    assert run["status"] == "succeeded", run
    inside, direct, redirected = run["tool_calls"][:3]
    assert json.loads(inside["result"])["body"] == "inside", inside
    for call in (direct, redirected):
        assert call["status"] == "error", call
        assert f"{test_host.outer_address}, an address of this host" in call["error"], call
    assert peers == []


@needs_netns
def test_a_name_is_connected_to_at_the_address_that_was_checked(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # DNS rebinding: the name answers an allowed address first, then the host's loopback.
    # Both guarded clients must connect where the check looked (the test host), never
    # resolve again on their own (to the loopback service on the same port).
    real = socket.getaddrinfo
    with namespace_host(public=True) as test_host, _answering(b"loopback", "text/plain") as port:
        answers: list[str] = []

        def rebinding(host: Any, *args: Any, **kwargs: Any) -> Any:
            if host == "rebind.test":
                answer = test_host.address if len(answers) % 2 == 0 else "127.0.0.1"
                answers.append(answer)
                return real(answer, *args, **kwargs)
            return real(host, *args, **kwargs)

        monkeypatch.setattr(socket, "getaddrinfo", rebinding)
        policy = EgressPolicy(allow_networks=parse_allowed_networks(test_host.network))
        url = f"http://rebind.test:{port}/"
        with _namespace_server(test_host, port):
            with guarded_client(policy, timeout=10) as client:
                first = client.get(url).text
                looked_up = len(answers)
                with pytest.raises(EgressRefused, match=r"127\.0\.0\.1, a loopback address"):
                    client.get(url)

            async def fetch() -> str:
                async with guarded_async_client(policy, timeout=10) as client:
                    text = (await client.get(url)).text
                    with pytest.raises(EgressRefused, match="a loopback address"):
                        await client.get(url)
                    return text

            answers.clear()
            first_async = asyncio.run(fetch())

    assert (first, looked_up) == ("inside", 1)
    assert first_async == "inside"


# -- the rules ---------------------------------------------------------------------------------


def _ip(text: str) -> ipaddress.IPv4Address | ipaddress.IPv6Address:
    return ipaddress.ip_address(text)


def test_every_address_of_this_host_is_refused_whatever_the_operator_allows() -> None:
    host = host_networks()
    policy = EgressPolicy(allow_networks=parse_allowed_networks("10.0.0.0/8,192.0.0.0/2,fd00::/8"))
    own = [net.network_address for net in host if net.prefixlen == net.max_prefixlen]
    assert own, host
    for address in own:
        assert refusal(address, policy, host) in ("a loopback address", "an address of this host")
    # Other forms of the loopback address: mapped, 6to4, NAT64, the unspecified address.
    for text in ("::ffff:127.0.0.1", "2002:7f00:1::1", "64:ff9b::7f00:1", "0.0.0.0", "::1"):
        assert refusal(_ip(text), policy, host) == "a loopback address", text
    # An address the operator opened that is not this host's passes.
    assert refusal(_ip("10.9.8.7"), policy, host) is None
    assert refusal(_ip("169.254.169.254"), policy, host) == "a link-local address"


def test_a_name_is_refused_when_any_of_its_addresses_is() -> None:
    policy = EgressPolicy(resolve=(("mixed.test", "127.0.0.1"),))
    with pytest.raises(EgressRefused, match=r"mixed\.test resolves to 127\.0\.0\.1, a loopback"):
        resolve_checked("mixed.test", 80, policy)
    with pytest.raises(EgressRefused, match="a loopback address"):
        resolve_checked("localhost", 80, EgressPolicy())


@pytest.mark.parametrize("entry", ["127.0.0.0/8", "0.0.0.0/0", "::1/128", "10.0.0.1/8", "x"])
def test_floom_egress_allow_refuses_what_can_never_be_opened(entry: str) -> None:
    with pytest.raises(ValueError, match="egress_allow"):
        Settings(egress_allow=entry)


# -- run callbacks and alert channels ----------------------------------------------------------


@contextmanager
def _counting() -> Iterator[tuple[int, list[str]]]:
    """A loopback receiver that answers 200 and keeps the path of every request it got."""
    got: list[str] = []

    class Handler(BaseHTTPRequestHandler):
        def do_POST(self) -> None:  # http.server's naming
            got.append(self.path)
            self.send_response(200)
            self.send_header("Content-Length", "0")
            self.end_headers()

        def log_message(self, *args: Any) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=server.serve_forever, args=(STOP_POLL_SECONDS,), daemon=True)
    thread.start()
    try:
        yield server.server_address[1], got
    finally:
        server.shutdown()
        server.server_close()


@pytest.mark.parametrize("database_url", ["sqlite"], indirect=True)
def test_callbacks_and_alert_channels_are_guarded_when_they_are_sent_not_only_when_set(
    tmp_path: Path, database_url: str
) -> None:
    """A URL checked when it was set may point at the host by the time floom sends to it (a
    name that resolves elsewhere now, a Slack URL secret changed since): the send is refused
    by the guard, and the receiver gets nothing."""
    from floom.services.access import secrets
    from floom.services.access.principal import SYSTEM
    from floom.services.alerts.channels import Channel
    from floom.services.alerts.senders import AlertUndeliverable, send_alert, send_callback
    from floom.services.context import Context
    from tests.support.harness import fast_settings

    settings = fast_settings(
        tmp_path / "data", database_url, agent_http_resolve="hooks.example.com=127.0.0.1"
    )
    ctx = Context.open(settings)
    try:
        with _counting() as (port, got):
            for url in (
                f"http://127.0.0.1:{port}/callback",
                f"http://hooks.example.com:{port}/callback",
            ):
                with pytest.raises(AlertUndeliverable, match="loopback"):
                    send_callback(ctx, delivery_id="dlv_egress", url=url, body="{}")
            secrets.set_secret(
                ctx, name="SLACK_URL", value=f"http://127.0.0.1:{port}/slack", caller=SYSTEM
            )
            secrets.set_secret(ctx, name="HOOK_KEY", value="whsec_" + "A" * 32, caller=SYSTEM)
            for channel in (
                Channel("ach_s", "slack", "slack", {"url_secret": "SLACK_URL"}),
                Channel(
                    "ach_w",
                    "hook",
                    "webhook",
                    {"url": f"http://hooks.example.com:{port}/hook", "secret": "HOOK_KEY"},
                ),
            ):
                with pytest.raises(AlertUndeliverable, match="loopback"):
                    send_alert(ctx, delivery_id="dlv_egress", channel=channel, body={})
            assert got == []
    finally:
        ctx.engine.dispose()
