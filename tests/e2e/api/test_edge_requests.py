"""What reaches floom from the edge: the web session cookie is `Secure` whenever the browser
speaks HTTPS to floom (directly, or to a proxy floom trusts to say so), and what anyone may
send without a valid key is limited per client address (429 rate_limited, Retry-After)."""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator
from contextlib import ExitStack
from pathlib import Path

import httpx
import pytest
import uvicorn

from floom.api.address_limit import AddressLimiter, client_key
from floom.api.app import create_app
from floom.config import Settings
from floom.services.access import keys
from floom.services.access.principal import SYSTEM
from floom.services.context import Context
from tests.support.harness import (
    LiveServer,
    fast_settings,
    free_port,
    live_server,
    wait_until,
)
from tests.support.rigs.alerts import self_signed
from tests.support.uvicorn_thread import QuickStopServer
from tests.support.web import csrf_of


@pytest.fixture
def database_url(tmp_path: Path) -> str:
    return f"sqlite:///{tmp_path / 'floom.db'}"  # the edge does not depend on the store


@pytest.fixture
def make_server(tmp_path: Path, database_url: str) -> Iterator[Callable[..., LiveServer]]:
    """Live servers as `floom serve` runs them (uvicorn reads no forwarding header itself),
    each with its settings overrides."""
    with ExitStack() as stack:
        yield lambda **overrides: stack.enter_context(
            live_server(tmp_path / "data", database_url, **overrides)
        )


def cookies_set(
    server: LiveServer, headers: dict[str, str] | None = None, *, verify: bool = True
) -> dict[str, str]:
    """Sign in through the form with these headers on every request; each cookie's
    Set-Cookie line, by name."""
    seen: dict[str, str] = {}
    with httpx.Client(
        base_url=server.base_url, headers=headers, timeout=10, verify=verify
    ) as browser:
        form = browser.get("/login")
        # Sent back by hand: a client keeps a Secure cookie from a plain-HTTP server.
        login_cookie = form.headers["set-cookie"].split(";", 1)[0]
        browser.cookies.clear()
        done = browser.post(
            "/login",
            data={"csrf": csrf_of(form.text), "api_key": server.admin_key, "next": "/"},
            headers={"Cookie": login_cookie},
        )
        assert done.status_code == 303, done.text
        for response in (form, done):
            for line in response.headers.get_list("set-cookie"):
                seen[line.split("=", 1)[0]] = line
    assert set(seen) == {"floom_login", "floom_session"}, seen
    return seen


def secure(line: str) -> bool:
    return "secure" in [part.strip().lower() for part in line.split(";")]


def test_the_session_cookie_is_secure_when_a_trusted_proxy_says_the_browser_spoke_https(
    make_server: Callable[..., LiveServer],
) -> None:
    server = make_server()  # trusts loopback, where the test's "proxy" connects from
    plain = cookies_set(server)
    assert not any(secure(line) for line in plain.values()), plain
    for headers in (
        {"X-Forwarded-Proto": "https"},
        {"Forwarded": 'for="203.0.113.7";proto=https'},  # RFC 7239
        {"Forwarded": "for=192.0.2.1;proto=http, for=198.51.100.2;proto=https"},  # last hop
    ):
        cookies = cookies_set(server, headers)
        assert all(secure(line) for line in cookies.values()), (headers, cookies)
        assert all("httponly" in line.lower() for line in cookies.values())


def test_forwarding_headers_count_only_from_the_proxies_floom_is_told_to_trust(
    make_server: Callable[..., LiveServer],
) -> None:
    untrusted = make_server(forwarded_allow_ips="10.0.0.0/8")
    cookies = cookies_set(untrusted, {"X-Forwarded-Proto": "https"})
    assert not any(secure(line) for line in cookies.values()), cookies

    trusted = make_server(forwarded_allow_ips="10.0.0.0/8, 127.0.0.0/8")
    cookies = cookies_set(trusted, {"X-Forwarded-Proto": "https"})
    assert all(secure(line) for line in cookies.values()), cookies


def test_an_https_public_url_makes_the_cookie_secure_whatever_the_proxy_says(
    make_server: Callable[..., LiveServer],
) -> None:
    server = make_server(public_url="https://floom.example.com", forwarded_allow_ips="")
    assert all(secure(line) for line in cookies_set(server).values())


def test_the_session_cookie_is_secure_when_floom_itself_is_served_over_https(
    tmp_path: Path, database_url: str
) -> None:
    """HTTPS straight to the ASGI server (uvicorn with a certificate), no proxy and no public
    URL: the browser spoke HTTPS, so the cookies are Secure."""
    cert, key = self_signed(tmp_path, "localhost")
    ctx = Context.open(fast_settings(tmp_path / "data", database_url, forwarded_allow_ips=""))
    _, admin = keys.create_key(ctx, caller=SYSTEM, scopes=["admin"], name="tls admin")
    port = free_port()
    config = uvicorn.Config(
        create_app(ctx=ctx),
        host="127.0.0.1",
        port=port,
        log_level="warning",
        proxy_headers=False,
        ssl_certfile=str(cert),
        ssl_keyfile=str(key),
    )
    server = QuickStopServer(config)
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    try:
        wait_until(lambda: server.started or not thread.is_alive())
        assert server.started
        live = LiveServer(ctx=ctx, base_url=f"https://127.0.0.1:{port}", admin_key=admin)
        cookies = cookies_set(live, verify=False)
        assert all(secure(line) for line in cookies.values()), cookies
    finally:
        server.should_exit = True
        thread.join(timeout=30)
        ctx.engine.dispose()


def test_a_forwarded_allow_ips_typo_is_refused_at_start() -> None:
    with pytest.raises(ValueError, match=r"'10\.0\.0\.0/33' is not an address or a network"):
        Settings(forwarded_allow_ips="10.0.0.0/33")


# -- the per-address limit ------------------------------------------------------------------


def assert_limited(response: httpx.Response) -> None:
    assert response.status_code == 429, (response.status_code, response.text)
    assert response.json()["error"]["code"] == "rate_limited"
    assert int(response.headers["Retry-After"]) >= 1


def test_every_route_reachable_without_a_key_is_limited_per_address(
    make_server: Callable[..., LiveServer],
) -> None:
    anonymous = (
        ("GET", "/healthz"),
        ("GET", "/login"),
        ("POST", "/login"),
        ("POST", "/hooks/nosuch"),
        ("GET", "/openapi.json"),
        ("GET", "/"),
        ("GET", "/docs"),
        ("POST", "/mcp"),
        ("GET", "/static/floom.css"),
        ("GET", "/no/such/page"),
    )
    for method, path in anonymous:
        server = make_server(anonymous_rate_limit_per_minute=1, anonymous_rate_limit_burst=3)
        with httpx.Client(base_url=server.base_url, timeout=10) as client:
            answers = [client.request(method, path) for _ in range(3)]
            assert all(a.status_code != 429 for a in answers), (path, answers)
            assert_limited(client.request(method, path))
            # Another route, the same address: the same bucket.
            assert_limited(client.get("/healthz"))
            # A valid key from the same address is its key's to limit, not the address's.
            keyed = client.get(
                "/api/v1/workers", headers={"Authorization": f"Bearer {server.admin_key}"}
            )
            assert keyed.status_code == 200, (path, keyed.text)


def test_refused_keys_empty_their_addresses_bucket_and_are_then_refused_before_the_lookup(
    make_server: Callable[..., LiveServer],
) -> None:
    server = make_server(anonymous_rate_limit_per_minute=1, anonymous_rate_limit_burst=3)
    with httpx.Client(base_url=server.base_url, timeout=10) as client:
        for _ in range(3):
            wrong = client.get("/api/v1/workers", headers={"Authorization": "Bearer flm_wrong"})
            assert wrong.status_code == 401
        assert_limited(client.get("/api/v1/workers", headers={"Authorization": "Bearer x"}))
        assert_limited(client.post("/mcp", headers={"Authorization": "Bearer flm_wrong"}))
        # The same for a browser whose session cookie is not valid.
        stale = client.get("/", headers={"Cookie": "floom_session=forged"})
        assert_limited(stale)


def test_behind_a_trusted_proxy_each_client_address_has_its_own_bucket(
    make_server: Callable[..., LiveServer],
) -> None:
    server = make_server(anonymous_rate_limit_per_minute=1, anonymous_rate_limit_burst=2)
    with httpx.Client(base_url=server.base_url, timeout=10) as proxy:

        def health(client_address: str) -> httpx.Response:
            return proxy.get("/healthz", headers={"X-Forwarded-For": client_address})

        assert [health("203.0.113.1").status_code for _ in range(2)] == [200, 200]
        assert_limited(health("203.0.113.1"))
        assert health("203.0.113.2").status_code == 200
        # An IPv6 client counts by its /64.
        assert [health(f"2001:db8::{i}").status_code for i in (1, 2)] == [200, 200]
        assert_limited(health("2001:db8::3"))
        assert health("2001:db8:0:1::1").status_code == 200


def test_the_address_table_is_bounded_least_recently_seen_first_out() -> None:
    now = [0.0]
    limiter = AddressLimiter(per_minute=1, burst=1, max_addresses=3, clock=lambda: now[0])
    for address in ("a", "b", "c"):
        assert limiter.charge(address) is None
    assert limiter.charge("a") == 60  # empty: a minute to the next request
    limiter.charge("d")  # "b" was seen least recently: it goes
    assert len(limiter) == 3
    assert limiter.charge("b") is None  # forgotten: a full bucket again (it evicts "c")
    assert limiter.charge("a") is not None  # kept: still empty


def test_client_keys_group_ipv6_by_64_and_unwrap_mapped_ipv4() -> None:
    assert client_key({"client": ("2001:db8::1", 1)}) == "2001:db8::/64"
    assert client_key({"client": ("::ffff:192.0.2.1", 1)}) == "192.0.2.1"
    assert client_key({"client": ("192.0.2.1", 1)}) == "192.0.2.1"
    assert client_key({}) == "unknown"
