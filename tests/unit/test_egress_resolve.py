"""Names resolved while a caller waits (a channel saved, a run started with a callback URL,
a worker.yml validated) are given a bounded time, and only a few are resolved at once: a
name whose server never answers (a domain a caller runs) is refused, and cannot hold the
server's threads. A stand-in resolver that answers only when the test lets it."""

from __future__ import annotations

import socket
import threading
from collections.abc import Iterator
from types import SimpleNamespace
from typing import Any

import pytest

from floom.config import Settings
from floom.net import egress
from floom.net.egress import EgressPolicy, EgressRefused, resolve_checked_now
from floom.services.alerts import channels
from floom.services.alerts.channels import ChannelInvalid

PUBLIC = "93.184.215.14"


@pytest.fixture
def slow_names(monkeypatch: pytest.MonkeyPatch) -> Iterator[threading.Event]:
    """getaddrinfo that answers names ending .slow.test only once the event is set."""
    answer = threading.Event()
    real = socket.getaddrinfo

    def getaddrinfo(host: str, port: Any, *args: Any, **kwargs: Any) -> Any:
        if host.endswith(".slow.test"):
            answer.wait(30)
            return [(socket.AF_INET, socket.SOCK_STREAM, 6, "", (PUBLIC, port))]
        if host.endswith(".fast.test"):
            return [(socket.AF_INET, socket.SOCK_STREAM, 6, "", (PUBLIC, port))]
        return real(host, port, *args, **kwargs)

    monkeypatch.setattr(socket, "getaddrinfo", getaddrinfo)
    yield answer
    answer.set()


def test_a_name_that_is_not_resolved_in_time_is_refused(slow_names: threading.Event) -> None:
    with pytest.raises(EgressRefused) as refused:
        resolve_checked_now("a.slow.test", 443, EgressPolicy(), seconds=0.2)
    assert "cannot resolve a.slow.test: no answer within 0.2 s" in refused.value.message
    assert resolve_checked_now("b.fast.test", 443, EgressPolicy(), seconds=5) == PUBLIC


def test_names_that_hang_hold_no_more_than_a_few_places(slow_names: threading.Event) -> None:
    for i in range(egress.RESOLVING):
        with pytest.raises(EgressRefused, match="no answer"):
            resolve_checked_now(f"n{i}.slow.test", 443, EgressPolicy(), seconds=0.05)
    # Every place is held by a resolution that hangs: the next caller is told at once.
    with pytest.raises(EgressRefused, match="too many names are being resolved"):
        resolve_checked_now("c.fast.test", 443, EgressPolicy(), seconds=0.05)
    slow_names.set()  # the resolver answers at last: the places are free again
    assert resolve_checked_now("c.fast.test", 443, EgressPolicy(), seconds=10) == PUBLIC


def test_the_guard_still_refuses_what_a_name_resolves_to(monkeypatch: pytest.MonkeyPatch) -> None:
    def getaddrinfo(host: str, port: Any, *args: Any, **kwargs: Any) -> Any:
        return [(socket.AF_INET, socket.SOCK_STREAM, 6, "", ("169.254.169.254", port))]

    monkeypatch.setattr(socket, "getaddrinfo", getaddrinfo)
    with pytest.raises(EgressRefused, match="link-local"):
        resolve_checked_now("metadata.test", 80, EgressPolicy(), seconds=5)


def test_names_a_caller_keeps_hanging_leave_floom_s_own_sends_their_places(
    slow_names: threading.Event, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Any read key validates a worker.yml whose callbacks name hosts that never answer (and a
    # deploy key saves such channels): while those hold every place of theirs, floom still
    # resolves the names it sends alerts and run callbacks to.
    monkeypatch.setattr(egress, "RESOLVE_SECONDS", 0.05)
    ctx: Any = SimpleNamespace(settings=Settings())
    for i in range(egress.RESOLVING):
        with pytest.raises(ChannelInvalid, match="no answer"):
            channels.check_reachable(ctx, f"n{i}.slow.test", 443, "config.host")
    with pytest.raises(ChannelInvalid, match="too many names are being resolved"):
        channels.check_reachable(ctx, "c.fast.test", 443, "config.host")
    # As the alert senders resolve (guarded_client, the SMTP client).
    assert resolve_checked_now("d.fast.test", 443, EgressPolicy(), seconds=5) == PUBLIC
    # And a run's agent has places of its own too.
    for i in range(egress.RESOLVING):
        with pytest.raises(EgressRefused, match="no answer"):
            resolve_checked_now(f"r{i}.slow.test", 443, EgressPolicy(), places=egress.RUNS)
    assert resolve_checked_now("e.fast.test", 443, EgressPolicy(), seconds=5) == PUBLIC


def test_an_address_written_out_or_a_mapped_name_is_answered_without_a_thread_or_a_place(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # Only a name the system's resolver is asked about can hang: an address written out, or
    # a name FLOOM_AGENT_HTTP_RESOLVE maps, starts no thread and takes none of the places,
    # so names that hang cannot stall connections to addresses.
    started: list[str] = []

    class NoThread:
        def __init__(self, *args: Any, name: str = "", **kwargs: Any) -> None:
            started.append(name)
            raise AssertionError("a thread was started to resolve an address written out")

    monkeypatch.setattr(egress, "threading", SimpleNamespace(Thread=NoThread))
    policy = EgressPolicy(resolve=(("mapped.test", PUBLIC),))
    places = threading.BoundedSemaphore(1)
    assert places.acquire(timeout=1)  # every place is held by a name that hangs
    assert resolve_checked_now(PUBLIC, 443, policy, places=places, seconds=0.05) == PUBLIC
    assert resolve_checked_now("2606:2800:220:1::1", 443, policy, places=places) == (
        "2606:2800:220:1::1"
    )
    assert resolve_checked_now("MAPPED.test", 443, policy, places=places) == PUBLIC
    # The guard's rules are the same without a lookup.
    with pytest.raises(EgressRefused, match="loopback"):
        resolve_checked_now("127.0.0.1", 80, policy, places=places)
    with pytest.raises(EgressRefused, match="link-local"):
        resolve_checked_now("169.254.169.254", 80, policy, places=places)
    with pytest.raises(EgressRefused, match="loopback"):
        resolve_checked_now("::ffff:127.0.0.1", 80, policy, places=places)
    assert started == []
    # A name to look up still waits for a place (and is told when none is free).
    with pytest.raises(EgressRefused, match="too many names are being resolved"):
        resolve_checked_now("a.fast.test", 443, policy, places=places, seconds=0.05)
