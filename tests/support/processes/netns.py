"""Test hosts in network namespaces the tests create: the outside world a sandbox may reach.

A test host is a network namespace joined to the root namespace by a veth pair in a /30:
the namespace holds one address, the root namespace (the floom host) the other. A sandbox's
user-mode networking connects from the root namespace, so both ends stand for machines
elsewhere, and test traffic never leaves this machine. `public=True` takes the /30 from
TEST-NET-3 (203.0.113.0/24), which sandboxes treat as the public internet; otherwise it comes
from 10.213.0.0/16, a private range sandboxes do not reach unless allowed.
"""

from __future__ import annotations

import os
import secrets
import shutil
import socket
import subprocess
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass

import pytest


def netns_unusable() -> str | None:
    """Why network-namespace tests cannot run here, or None when they can."""
    if os.geteuid() != 0:
        return "creating a test host in a network namespace needs root"
    if shutil.which("ip") is None:
        return "iproute2 (ip) is not installed"
    done = subprocess.run(["ip", "netns", "list"], capture_output=True, timeout=10)
    if done.returncode != 0:
        return f"ip netns is unavailable: {done.stderr.decode().strip()}"
    return None


needs_netns = pytest.mark.skipif(netns_unusable() is not None, reason=str(netns_unusable()))


@dataclass(frozen=True)
class NamespaceHost:
    namespace: str
    address: str
    """The test host's address, inside its namespace."""
    outer_address: str
    """The other end, in the root namespace: an address of floom's own host, which no
    sandbox may reach (a stand-in for a sandbox to reach runs inside, by `popen`)."""
    network: str

    def popen(
        self, argv: list[str], *, stdout: int = subprocess.DEVNULL
    ) -> subprocess.Popen[bytes]:
        """Start a process inside the test host's namespace."""
        return subprocess.Popen(
            ["ip", "netns", "exec", self.namespace, *argv],
            stdout=stdout,
            stderr=subprocess.DEVNULL,
        )


def _ip(*args: str) -> subprocess.CompletedProcess[bytes]:
    return subprocess.run(["ip", *args], capture_output=True, timeout=10)


def _check(done: subprocess.CompletedProcess[bytes]) -> None:
    assert done.returncode == 0, done.stderr.decode()


@contextmanager
def namespace_host(*, public: bool = False) -> Iterator[NamespaceHost]:
    tag = secrets.token_hex(3)
    namespace, outer, inner = f"floomtest-{tag}", f"fth{tag}", f"ftn{tag}"
    _check(_ip("netns", "add", namespace))
    try:
        _check(_ip("link", "add", outer, "type", "veth", "peer", "name", inner))
        _check(_ip("link", "set", inner, "netns", namespace))
        for _ in range(20):  # another test may hold a subnet; a random other one is free
            if public:
                base = f"203.0.113.{4 * secrets.randbelow(64)}"
            else:
                base = f"10.213.{secrets.randbelow(256)}.0"
            prefix, last = base.rsplit(".", 1)
            outer_address, address = f"{prefix}.{int(last) + 1}", f"{prefix}.{int(last) + 2}"
            if not _ip("-o", "-4", "addr", "show", "to", f"{base}/30").stdout.strip():
                break
        else:
            pytest.fail("no free /30 subnet for a test host")
        _check(_ip("addr", "add", f"{outer_address}/30", "dev", outer))
        inside = ("netns", "exec", namespace, "ip")
        _check(_ip(*inside, "addr", "add", f"{address}/30", "dev", inner))
        _check(_ip(*inside, "link", "set", inner, "up"))
        _check(_ip(*inside, "link", "set", "lo", "up"))
        _check(_ip("link", "set", outer, "up"))
        yield NamespaceHost(namespace, address, outer_address, f"{base}/30")
    finally:
        _ip("link", "del", outer)  # takes its peer in the namespace along
        _ip("netns", "del", namespace)


@contextmanager
def host_wide_listener() -> Iterator[tuple[int, list[str]]]:
    """A service bound to 0.0.0.0 on the host: every address of the host answers. Yields its
    port and the peers that connected."""
    peers: list[str] = []
    server = socket.socket()
    server.bind(("0.0.0.0", 0))
    server.listen()
    server.settimeout(0.2)
    stop = threading.Event()

    def accept() -> None:
        while not stop.is_set():
            try:
                conn, peer = server.accept()
            except TimeoutError:
                continue
            except OSError:
                return
            peers.append(peer[0])
            conn.close()

    thread = threading.Thread(target=accept, daemon=True)
    thread.start()
    try:
        yield server.getsockname()[1], peers
    finally:
        stop.set()
        thread.join(5)
        server.close()
