"""A sandbox with network: its own namespace through slirp4netns, fenced off from the host.

The outside world is a test host in a network namespace each test creates (see
tests/support/processes/netns.py), with a small HTTP server in it. Probes from inside the
sandbox touch nothing but loopback and that test host: every other address is first checked
with a UDP `connect()`, which only asks the kernel for a route and sends no packet, and a TCP
connect is tried only where that lookup already failed, to show it fails at once too.
"""

from __future__ import annotations

import errno
import fcntl
import ipaddress
import json
import os
import secrets
import select
import shutil
import signal
import socket
import struct
import subprocess
import sys
import textwrap
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import httpx
import pytest

from floom.errors import InvalidRequest
from floom.manifest.load import check_manifest
from floom.net.addresses import host_networks
from floom.sandbox import LocalSandbox, SandboxResult, SandboxSpec
from floom.sandbox.local import cgroups, network
from floom.sandbox.local.network import SLIRP_OWNER_VARIABLE, is_floom_slirp, route_commands
from floom.sandbox.local.uid_pool import UidRange
from tests.support.harness import LiveServer, deploy_folder, make_worker, wait_for_run, wait_until
from tests.support.processes.netns import (
    NamespaceHost,
    host_wide_listener,
    namespace_host,
    needs_netns,
)

needs_bwrap = pytest.mark.skipif(
    shutil.which("bwrap") is None, reason="bubblewrap (bwrap) is not installed"
)
# Refused locally by an unreachable route: the errnos a blocked address must give, at once.
REFUSED_BY_ROUTE = {"EHOSTUNREACH", "ENETUNREACH", "EACCES"}
FAST_SECONDS = 0.5

# Runs inside the sandbox: reads probes from probes.json, prints one JSON line of results.
PROBE_WORKER = r"""
import errno, json, socket, time, urllib.request

def name(exc):
    return errno.errorcode.get(exc.errno, str(exc)) if isinstance(exc, OSError) else str(exc)

def route(host, port):
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        try:
            s.connect((host, port))  # a route lookup; UDP sends nothing on connect
            return "routed"
        except OSError as exc:
            return name(exc)

def tcp(host, port):
    start = time.monotonic()
    with socket.socket() as s:
        s.settimeout(3)
        try:
            s.connect((host, port))
            outcome = "connected"
        except OSError as exc:
            outcome = name(exc) if exc.errno else "timeout"
    return {"outcome": outcome, "seconds": time.monotonic() - start}

def probe(kind, host, port):
    if kind == "route":
        return {"outcome": route(host, port), "seconds": 0.0}
    if kind == "guarded":  # never a packet to an address that has a route
        looked_up = route(host, port)
        return {"outcome": "routed", "seconds": 0.0} if looked_up == "routed" else tcp(host, port)
    if kind == "tcp":
        return tcp(host, port)
    if kind == "http":
        try:
            with urllib.request.urlopen(f"http://{host}:{port}/token.txt", timeout=5) as r:
                return {"outcome": "fetched", "body": r.read().decode()}
        except OSError as exc:
            return {"outcome": name(getattr(exc, "reason", exc))}
    if kind == "ipv6":
        return {"outcome": open("/proc/net/if_inet6").read().strip() or "none"}
    if kind == "route6":  # a route lookup over IPv6; UDP sends nothing on connect
        try:
            with socket.socket(socket.AF_INET6, socket.SOCK_DGRAM) as s:
                s.connect((host, port))
                return {"outcome": "routed"}
        except OSError as exc:
            return {"outcome": name(exc)}
    if kind == "links":
        rows = open("/proc/net/dev").read().splitlines()[2:]
        return {"outcome": sorted(row.split(":")[0].strip() for row in rows)}
    if kind == "reroute":  # try to remove the fence from inside
        import subprocess
        done = subprocess.run(["ip", "route", "del", "unreachable", host], capture_output=True)
        return {"outcome": done.returncode, "stderr": done.stderr.decode().strip()}
    if kind == "resolv":
        return {"outcome": open("/etc/resolv.conf").read().strip()}
    raise SystemExit(f"unknown probe {kind}")

probes = json.load(open("probes.json"))
print(json.dumps({key: probe(*spec) for key, spec in probes.items()}))
"""


@dataclass(frozen=True)
class WebHost:
    """A test host serving token.txt over HTTP."""

    namespace: str
    address: str
    network: str
    port: int
    token: str


@contextmanager
def web_host(tmp_path: Path, *, public: bool) -> Iterator[WebHost]:
    with namespace_host(public=public) as host:
        token = secrets.token_hex(8)
        site = tmp_path / f"site-{token}"
        site.mkdir()
        (site / "token.txt").write_text(token)
        port = 8000 + secrets.randbelow(1000)
        server = host.popen(
            [
                sys.executable,
                "-m",
                "http.server",
                "--bind",
                host.address,
                "--directory",
                str(site),
                str(port),
            ]
        )
        try:
            wait_until(lambda: can_connect(host.address, port), timeout=10)
            yield WebHost(host.namespace, host.address, host.network, port, token)
        finally:
            server.kill()
            server.wait(10)


@pytest.fixture
def test_host(tmp_path: Path) -> Iterator[WebHost]:
    """A private test host (10.213.x.2)."""
    with web_host(tmp_path, public=False) as host:
        yield host


@pytest.fixture
def public_host(tmp_path: Path) -> Iterator[WebHost]:
    """A test host at an address sandboxes treat as the public internet (203.0.113.x)."""
    with web_host(tmp_path, public=True) as host:
        yield host


def can_connect(host: str, port: int) -> bool:
    try:
        socket.create_connection((host, port), timeout=1).close()
        return True
    except OSError:
        return False


@pytest.fixture
def loopback_listener() -> Iterator[int]:
    """A service on the host's 127.0.0.1."""
    with socket.socket() as server:
        server.bind(("127.0.0.1", 0))
        server.listen()
        yield server.getsockname()[1]


def probe(
    tmp_path: Path, probes: dict[str, list[Any]], **spec_fields: Any
) -> tuple[dict[str, Any], SandboxResult]:
    workdir, output_dir = tmp_path / "work", tmp_path / "output"
    workdir.mkdir()
    output_dir.mkdir()
    (workdir / "run.py").write_text(PROBE_WORKER)
    (workdir / "probes.json").write_text(json.dumps(probes))
    lines: list[tuple[str, str]] = []
    spec = SandboxSpec(
        run_id="run-net",
        command=["python3", "run.py"],
        workdir=workdir,
        output_dir=output_dir,
        timeout_seconds=60.0,
        **spec_fields,
    )
    result = LocalSandbox().run(
        spec, on_line=lambda s, line: lines.append((s, line)), should_cancel=lambda: False
    )
    assert result.exit_code == 0, lines
    stdout = [line for stream, line in lines if stream == "stdout"]
    results: dict[str, Any] = json.loads(stdout[-1])
    return results, result


def assert_refused_by_route(outcome: dict[str, Any]) -> None:
    assert outcome["outcome"] in REFUSED_BY_ROUTE, outcome
    assert outcome["seconds"] < FAST_SECONDS, outcome


def slirp_processes(work_root: Path) -> list[int]:
    marker = os.fsencode(os.path.realpath(work_root) + "/")
    found = []
    for entry in os.scandir("/proc"):
        if entry.name.isdigit():
            try:
                argv = Path(entry.path, "cmdline").read_bytes().split(b"\0")
            except OSError:
                continue  # it ended while we looked
            if is_floom_slirp(entry.name, argv, marker):
                found.append(int(entry.name))
    return found


def own_addresses(extra: str) -> dict[str, list[str]]:
    """The host's own addresses, read now (the test host's veth end `extra` among them):
    IPv4 and IPv6, each a single address."""
    found: dict[str, list[str]] = {"v4": [], "v6": []}
    for net in host_networks():
        if net.prefixlen == net.max_prefixlen:
            found["v4" if net.version == 4 else "v6"].append(str(net.network_address))
    assert extra in found["v4"], found
    return found


def probe_own_addresses(
    tmp_path: Path, test_host: NamespaceHost, port: int, **spec_fields: Any
) -> tuple[dict[str, Any], dict[str, list[str]]]:
    own = own_addresses(test_host.outer_address)
    probes: dict[str, list[Any]] = {f"v4 {a}": ["tcp", a, port] for a in own["v4"]}
    probes |= {f"v6 {a}": ["route6", a.split("%")[0], port] for a in own["v6"]}
    results, _ = probe(tmp_path, probes, network=True, **spec_fields)
    return results, own


@needs_bwrap
@needs_netns
def test_a_worker_with_network_reaches_no_address_of_its_own_host_in_any_range(
    tmp_path: Path,
) -> None:
    # The test host's veth end in the root namespace is an address of this host in TEST-NET-3,
    # which sandboxes treat as public; a service bound to 0.0.0.0 listens on it.
    with namespace_host(public=True) as test_host, host_wide_listener() as (port, peers):
        results, own = probe_own_addresses(tmp_path, test_host, port)

    for address in own["v4"]:
        outcome = results[f"v4 {address}"]
        if address.startswith("127."):
            # The sandbox's own loopback, where nothing listens.
            assert outcome["outcome"] in {"ECONNREFUSED", *REFUSED_BY_ROUTE}, (address, outcome)
        else:
            assert_refused_by_route(outcome)
    for address in own["v6"]:
        assert results[f"v6 {address}"]["outcome"] != "routed", (address, results)
    assert peers == []


@needs_bwrap
@needs_netns
def test_network_allow_does_not_open_the_hosts_own_addresses(tmp_path: Path) -> None:
    with namespace_host() as test_host, host_wide_listener() as (port, peers):
        results, _ = probe(
            tmp_path,
            {
                "host_end": ["tcp", test_host.outer_address, port],
                "test_host": ["route", test_host.address, port],
            },
            network=True,
            network_allow=(test_host.network,),
        )

    assert_refused_by_route(results["host_end"])
    assert results["test_host"]["outcome"] == "routed"
    assert peers == []


def test_the_fence_closes_the_hosts_addresses_after_what_is_allowed() -> None:
    allowed = ipaddress.IPv4Network("203.0.113.0/24")
    own = ipaddress.IPv4Network("203.0.113.7/32")
    script = route_commands([allowed], [own]).splitlines()

    assert script[-1] == "route replace unreachable 203.0.113.7/32"
    assert not any(line.endswith(f" {allowed}") for line in script)


# -- through LocalSandbox ----------------------------------------------------------------------


@needs_bwrap
@needs_netns
def test_a_worker_with_network_cannot_reach_the_hosts_loopback(
    tmp_path: Path, loopback_listener: int
) -> None:
    results, _ = probe(
        tmp_path,
        {
            "loopback": ["tcp", "127.0.0.1", loopback_listener],
            "gateway": ["guarded", "10.0.2.2", loopback_listener],
            "slirp_neighbour": ["guarded", "10.0.2.5", loopback_listener],
            "dns_forwarder_other_port": ["guarded", "10.0.2.3", loopback_listener],
            "ipv6": ["ipv6", "", 0],
        },
        network=True,
    )

    # 127.0.0.1 in the sandbox is its own loopback, where nothing listens.
    assert results["loopback"]["outcome"] == "ECONNREFUSED", results
    for key in ("gateway", "slirp_neighbour", "dns_forwarder_other_port"):
        assert_refused_by_route(results[key])
    assert results["ipv6"]["outcome"] == "none"


@needs_bwrap
@needs_netns
def test_a_worker_with_network_has_no_route_to_private_link_local_or_multicast_addresses(
    tmp_path: Path, test_host: WebHost
) -> None:
    targets = {
        "test_host": test_host.address,
        "metadata": "169.254.169.254",
        "ten": "10.1.2.3",
        "cgnat": "100.64.0.1",
        "one_seven_two": "172.16.0.1",
        "one_nine_two": "192.168.1.1",
        "multicast": "224.0.0.251",
    }
    results, _ = probe(
        tmp_path,
        {
            **{key: ["guarded", host, 80] for key, host in targets.items()},
            "test_host_port": ["guarded", test_host.address, test_host.port],
            # Public addresses and DNS on port 53 do have a route (looked up, never sent to).
            "public": ["route", "198.51.100.1", 443],
            "dns": ["route", "10.0.2.3", 53],
            "resolv": ["resolv", "", 0],
        },
        network=True,
    )

    for key in (*targets, "test_host_port"):
        assert_refused_by_route(results[key])
    assert results["public"]["outcome"] == "routed"
    assert results["dns"]["outcome"] == "routed"
    assert results["resolv"]["outcome"] == "nameserver 10.0.2.3"


@needs_bwrap
@needs_netns
def test_a_worker_cannot_remove_the_routes_that_fence_it(tmp_path: Path) -> None:
    results, _ = probe(
        tmp_path,
        {
            "reroute": ["reroute", "169.254.0.0/16", 0],
            "metadata": ["guarded", "169.254.169.254", 80],
        },
        network=True,
    )

    assert results["reroute"]["outcome"] != 0
    assert "Operation not permitted" in results["reroute"]["stderr"]
    assert_refused_by_route(results["metadata"])


@needs_bwrap
@needs_netns
def test_a_worker_with_network_reaches_public_addresses(
    tmp_path: Path, public_host: WebHost
) -> None:
    results, _ = probe(
        tmp_path, {"fetch": ["http", public_host.address, public_host.port]}, network=True
    )

    assert results["fetch"] == {"outcome": "fetched", "body": public_host.token}
    # slirp4netns's own sandbox must not unmount the host's shared mounts (it did, taking
    # every `ip netns` namespace with it, until it got a private mount namespace).
    assert os.path.ismount(f"/run/netns/{public_host.namespace}")


@needs_bwrap
@needs_netns
def test_an_allowlisted_network_is_reachable_and_only_that_one(
    tmp_path: Path, test_host: WebHost
) -> None:
    neighbour = test_host.address.rsplit(".", 1)[0] + ".6"  # just outside the /30
    results, _ = probe(
        tmp_path,
        {
            "fetch": ["http", test_host.address, test_host.port],
            "neighbour": ["guarded", neighbour, 80],
            "metadata": ["guarded", "169.254.169.254", 80],
        },
        network=True,
        network_allow=(test_host.network,),
    )

    assert results["fetch"] == {"outcome": "fetched", "body": test_host.token}
    assert_refused_by_route(results["neighbour"])
    assert_refused_by_route(results["metadata"])


@needs_bwrap
@needs_netns
def test_a_worker_without_network_has_only_loopback_and_no_route(
    tmp_path: Path, test_host: WebHost
) -> None:
    results, _ = probe(
        tmp_path,
        {
            "links": ["links", "", 0],
            "test_host": ["route", test_host.address, test_host.port],
            "public": ["route", "198.51.100.1", 443],
            "resolv": ["resolv", "", 0],
        },
    )

    assert results["links"]["outcome"] == ["lo"]
    assert results["test_host"]["outcome"] == "ENETUNREACH"
    assert results["public"]["outcome"] == "ENETUNREACH"
    # No resolver at all: neither slirp's forwarder nor the host's own servers.
    assert "nameserver" not in results["resolv"]["outcome"]
    assert slirp_processes(tmp_path) == []


@needs_bwrap
@needs_netns
def test_slirp4netns_runs_with_the_run_and_ends_with_it(tmp_path: Path) -> None:
    workdir, output_dir = tmp_path / "work", tmp_path / "output"
    workdir.mkdir()
    output_dir.mkdir()
    (workdir / "run.py").write_text("print('ready', flush=True)\nimport time\ntime.sleep(600)\n")
    seen_while_running: list[int] = []
    cancel = threading.Event()

    def on_line(stream: str, line: str) -> None:
        if line == "ready":
            seen_while_running.extend(slirp_processes(tmp_path))
            cancel.set()

    spec = SandboxSpec(
        run_id="run-net",
        command=["python3", "run.py"],
        workdir=workdir,
        output_dir=output_dir,
        network=True,
        timeout_seconds=60.0,
    )
    result = LocalSandbox().run(spec, on_line=on_line, should_cancel=cancel.is_set)

    assert result.cancelled
    assert len(seen_while_running) == 1
    assert slirp_processes(tmp_path) == []
    with pytest.raises(ProcessLookupError):
        os.kill(seen_while_running[0], 0)


needs_cgroups = pytest.mark.skipif(
    not cgroups.detect().enforced, reason="no usable cgroup hierarchy on this node"
)


def _cgroup_lines(pid: int) -> set[str]:
    return set(Path(f"/proc/{pid}/cgroup").read_text().splitlines())


@needs_bwrap
@needs_netns
@needs_cgroups
def test_slirp4netns_runs_in_the_runs_cgroup_with_nothing_of_the_worker(tmp_path: Path) -> None:
    marker = f"worker-bytes-{secrets.token_hex(6)}"

    def look(slirp: int) -> dict[str, Any]:
        command = _command_pid(marker)
        return {
            "slirp": _cgroup_lines(slirp),
            "command": _cgroup_lines(command),
            "cwd": os.readlink(f"/proc/{slirp}/cwd"),
            "argv": _cmdline_of(str(slirp)),
            "environ": Path(f"/proc/{slirp}/environ").read_bytes(),
        }

    result, seen = _look_at_slirp_while_a_run_waits(
        tmp_path,
        look,
        command=["python3", "run.py", marker],
        env={"WORKER_SAYS": marker},
        network_allow=("10.213.0.0/30",),
    )

    assert result.cancelled, result
    run_groups = {line for line in seen["command"] if "/floom/" in line}
    assert run_groups, seen["command"]
    # In the run's cgroup in every hierarchy that limits the run: its memory and CPU count.
    assert run_groups <= seen["slirp"], seen
    assert seen["cwd"] == "/"
    for what in ("argv", "environ"):
        assert marker.encode() not in seen[what], (what, seen[what])
    names = {entry.split(b"=", 1)[0] for entry in seen["environ"].split(b"\0") if entry}
    # PWD: bubblewrap's, always "/" (where floom confines it as root).
    assert names - {b"PWD"} == {b"PATH", SLIRP_OWNER_VARIABLE.encode()}
    if b"PWD" in names:
        assert b"PWD=/\0" in seen["environ"]


_CAP_NET_BIND_SERVICE = 10
_NS_GET_OWNER_UID = 0xB704  # ioctl: the uid that owns a user namespace


@needs_bwrap
@needs_netns
@pytest.mark.skipif(os.geteuid() != 0, reason="as another user it runs as floom's own uid")
def test_slirp4netns_serves_as_a_uid_of_its_own_with_no_capability_of_the_host(
    tmp_path: Path,
) -> None:
    # It parses the worker's packets for as long as the run lasts: as a uid of its own (not
    # 0, not the run's), in a user namespace that uid owns, so no capability of the host's;
    # within that namespace only CAP_NET_BIND_SERVICE (its --enable-sandbox keeps it), which
    # owns no network namespace. no_new_privs, its seccomp filter, a PID namespace of its own
    # and no /run nor /etc but the entries programs need (no /etc/shadow) besides.
    marker = f"worker-{secrets.token_hex(6)}"

    def look(slirp: int) -> dict[str, Any]:
        status = Path(f"/proc/{slirp}/status").read_text().splitlines()
        command = Path(f"/proc/{_command_pid(marker)}/status").read_text().splitlines()
        userns = os.open(f"/proc/{slirp}/ns/user", os.O_RDONLY)
        try:
            owner = struct.unpack("I", fcntl.ioctl(userns, _NS_GET_OWNER_UID, bytes(4)))[0]
        finally:
            os.close(userns)
        return {
            "pid": slirp,
            "status": dict(line.split(":\t", 1) for line in status if ":\t" in line),
            "command": dict(line.split(":\t", 1) for line in command if ":\t" in line),
            "same_uid": (same := _pids_of_uid(int(_status_uid(status)))),
            "others": {pid: _described(pid) for pid in same if pid != slirp},
            "user_ns": os.readlink(f"/proc/{slirp}/ns/user"),
            "user_ns_owner": owner,
            "pid_ns": os.readlink(f"/proc/{slirp}/ns/pid"),
            "run": os.listdir(f"/proc/{slirp}/root/run"),
            "etc": os.listdir(f"/proc/{slirp}/root/etc"),
        }

    result, seen = _look_at_slirp_while_a_run_waits(
        tmp_path, look, command=["python3", "run.py", marker]
    )

    assert result.cancelled, result
    status = seen["status"]
    uids = {int(uid) for uid in status["Uid"].split()}
    gids = {int(gid) for gid in status["Gid"].split()}
    [uid] = uids
    assert uid != 0
    assert gids == {uid}, status
    assert status["Groups"].strip() == "", status
    run_uid = int(seen["command"]["Uid"].split()[0])
    assert uid != run_uid, (uid, run_uid)
    # Its own: nothing else runs as it (the process that made its user namespace ended).
    assert seen["same_uid"] == [seen["pid"]], (seen["same_uid"], seen["others"])
    uids_range = UidRange()
    assert uids_range.base <= uid <= uids_range.last, uid
    # No capability of the host's: its user namespace is not the host's but one it owns.
    assert seen["user_ns"] != os.readlink("/proc/self/ns/user")
    assert seen["user_ns_owner"] == uid
    for field in ("CapEff", "CapPrm", "CapBnd"):
        assert int(status[field], 16) & ~(1 << _CAP_NET_BIND_SERVICE) == 0, (field, status)
    assert int(status["CapAmb"], 16) == 0, status
    assert int(status["CapInh"], 16) & ~(1 << _CAP_NET_BIND_SERVICE) == 0, status
    assert status["NoNewPrivs"] == "1"
    assert status["Seccomp"] == "2"
    assert seen["pid_ns"] != os.readlink("/proc/self/ns/pid")
    assert status["NSpid"].split()[-1] == "1"
    assert seen["run"] == []
    assert "shadow" not in seen["etc"], seen["etc"]
    assert "resolv.conf" in seen["etc"], seen["etc"]  # its DNS forwarder's upstream
    assert slirp_processes(tmp_path) == []


@pytest.mark.skipif(os.geteuid() != 0, reason="as another user it runs as floom's own uid")
@pytest.mark.skipif(shutil.which("slirp4netns") is None, reason="slirp4netns is not installed")
def test_the_protections_report_says_slirp4netns_serves_as_a_uid_of_its_own() -> None:
    ranged, own = LocalSandbox(), LocalSandbox(uids=None)
    try:
        assert "as a uid of its own" in str(ranged.protections()["network"])
        # Without a uid range (tests only), it stays uid 0: the report does not say it.
        assert "uid of its own" not in str(own.protections()["network"])
    finally:
        ranged.close()
        own.close()


def _status_uid(status: list[str]) -> str:
    """The real uid in a /proc/<pid>/status's lines."""
    return next(line.split()[1] for line in status if line.startswith("Uid:"))


def _networked_spec_that_marks_its_start(
    tmp_path: Path, *, network_allow: tuple[str, ...] = ()
) -> SandboxSpec:
    """A run with network whose command, if it ever started, would leave /output/ran."""
    workdir, output_dir = tmp_path / "work", tmp_path / "output"
    workdir.mkdir()
    output_dir.mkdir()
    (workdir / "run.py").write_text("open('/output/ran', 'w').close()\n")
    return SandboxSpec(
        run_id="run-net",
        command=["python3", "run.py"],
        workdir=workdir,
        output_dir=output_dir,
        network=True,
        network_allow=network_allow,
    )


def _pids_of_uid(uid: int) -> list[int]:
    """The host pids of the live processes whose real uid is `uid`: not the zombies of
    ended ones that wait for the host's pid 1 to reap them (it may take seconds), which run
    nothing and hold nothing of the uid's."""
    found = []
    for entry in os.scandir("/proc"):
        if entry.name.isdigit():
            try:
                status = Path(entry.path, "status").read_text().splitlines()
            except OSError:
                continue  # it ended while we looked
            state = next((line.split()[1] for line in status if line.startswith("State:")), "")
            if int(_status_uid(status)) == uid and state not in ("Z", "X"):
                found.append(int(entry.name))
    return found


def _described(pid: int) -> str:
    """What process `pid` is, for a failure's message: its command line and parent."""
    try:
        command = Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode()
        status = Path(f"/proc/{pid}/status").read_text().splitlines()
    except OSError as exc:
        return f"ended ({exc.strerror})"
    parent = next((line for line in status if line.startswith("PPid:")), "")
    return f"{command.strip()!r} {parent}"


def _command_pid(marker: str) -> int:
    """The host pid of the run's command, `python3 run.py <marker>`."""
    [command] = [
        int(pid)
        for pid in os.listdir("/proc")
        if pid.isdigit() and _cmdline_of(pid).startswith(b"python3\0run.py\0" + marker.encode())
    ]
    return command


def _look_at_slirp_while_a_run_waits(
    tmp_path: Path, look: Callable[[int], dict[str, Any]], **spec_fields: Any
) -> tuple[SandboxResult, dict[str, Any]]:
    """Run a networked script that says "ready" and waits; `look` at the run's slirp4netns
    (its pid) then, and cancel the run. The run's result and what `look` saw."""
    workdir, output_dir = tmp_path / "work", tmp_path / "output"
    workdir.mkdir()
    output_dir.mkdir()
    (workdir / "run.py").write_text("print('ready', flush=True)\nimport time\ntime.sleep(600)\n")
    seen: dict[str, Any] = {}
    cancel = threading.Event()

    def on_line(stream: str, line: str) -> None:
        if line == "ready":
            [slirp] = slirp_processes(tmp_path)
            seen.update(look(slirp))
            cancel.set()

    spec = SandboxSpec(
        run_id="run-net",
        workdir=workdir,
        output_dir=output_dir,
        network=True,
        timeout_seconds=60.0,
        **{"command": ["python3", "run.py"], **spec_fields},
    )
    result = LocalSandbox().run(spec, on_line=on_line, should_cancel=cancel.is_set)
    return result, seen


def _cmdline_of(pid: str) -> bytes:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:
        return b""


@needs_bwrap
@needs_netns
@pytest.mark.skipif(os.geteuid() != 0, reason="as another user it runs as floom's own uid")
def test_a_run_whose_slirp4netns_cannot_get_its_user_namespace_is_refused_before_its_command(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # As where the kernel refuses a uid a user namespace: never a fall back to uid 0.
    def which(name: str) -> str | None:
        return "/bin/false" if name == "unshare" else shutil.which(name)

    # Only network.py's lookups: the launcher's own tools stay as they are.
    monkeypatch.setattr(network, "shutil", SimpleNamespace(which=which))
    spec = _networked_spec_that_marks_its_start(tmp_path)
    sandbox = LocalSandbox()
    try:
        with pytest.raises(network.NetworkSetupFailed, match="user namespace") as refused:
            sandbox.run(spec, on_line=lambda s, line: None, should_cancel=lambda: False)
    finally:
        sandbox.close()

    assert "user.max_user_namespaces" in str(refused.value.hint)
    assert not (spec.output_dir / "ran").exists()
    assert slirp_processes(tmp_path) == []


@needs_bwrap
@needs_netns
def test_a_bad_allowlist_entry_refuses_the_run_before_the_command_starts(tmp_path: Path) -> None:
    spec = _networked_spec_that_marks_its_start(tmp_path, network_allow=("127.0.0.1/32",))

    with pytest.raises(InvalidRequest, match="network_allow"):
        LocalSandbox().run(spec, on_line=lambda s, line: None, should_cancel=lambda: False)

    assert not (spec.output_dir / "ran").exists()
    assert slirp_processes(tmp_path) == []


def test_kill_orphans_kills_slirp4netns_left_on_this_nodes_work_root(tmp_path: Path) -> None:
    work_root = tmp_path / "data" / "runs"
    (work_root / "run-1").mkdir(parents=True)
    elsewhere = tmp_path / "other" / "run-2"
    elsewhere.mkdir(parents=True)
    sleeper = shutil.which("sleep")
    assert sleeper is not None
    ours, theirs = (
        subprocess.Popen(
            ["slirp4netns", "600"],
            executable=sleeper,
            env={SLIRP_OWNER_VARIABLE: os.path.realpath(path)},
        )
        for path in (work_root / "run-1", elsewhere)
    )
    try:
        wait_until(lambda: slirp_processes(work_root) == [ours.pid], timeout=10)

        LocalSandbox().kill_orphans(work_root)

        assert ours.wait(10) == -signal.SIGKILL
        assert theirs.poll() is None
    finally:
        for proc in (ours, theirs):
            proc.kill()
            proc.wait()


@needs_bwrap
@needs_netns
def test_kill_orphans_kills_a_live_slirp4netns_whatever_uid_it_serves_as(tmp_path: Path) -> None:
    # As a floom restarted after a crash would: the run's slirp4netns is found by its
    # environment, as the run's uid of its own or not.
    def look(slirp: int) -> dict[str, Any]:
        pidfd = os.pidfd_open(slirp)
        restarted = LocalSandbox(uids=None)
        try:
            killed = restarted.kill_orphans(tmp_path)
            ended = select.select([pidfd], [], [], 10)[0]
        finally:
            os.close(pidfd)
            restarted.close()
        return {"killed": killed, "ended": bool(ended)}

    result, seen = _look_at_slirp_while_a_run_waits(tmp_path, look)

    assert seen["ended"], (seen, result)
    assert seen["killed"] >= 1, seen
    assert slirp_processes(tmp_path) == []


# -- the manifest ------------------------------------------------------------------------------


def test_network_allow_accepts_ipv4_networks_next_to_network_full() -> None:
    manifest, problems = check_manifest(
        "name: w\nnetwork: full\nnetwork_allow: [10.213.0.0/30, 192.168.4.7]\n", ["run.py"]
    )

    assert problems == []
    assert manifest is not None
    assert manifest.network_allow == ["10.213.0.0/30", "192.168.4.7"]


@pytest.mark.parametrize(
    ("entries", "path", "words"),
    [
        ("[10.1.2.3/24]", "network_allow[0]", "the network is 10.1.2.0/24"),
        ("[fd00::/8]", "network_allow[0]", "IPv6"),
        ("[10.0.0.0/8, 127.0.0.1]", "network_allow[1]", "127.0.0.0/8"),
        ("[10.0.2.3]", "network_allow[0]", "10.0.2.0/24"),
        ("[intranet]", "network_allow[0]", "not an IPv4 network"),
        ("10.1.0.0/16", "network_allow", "must be a list"),
    ],
)
def test_network_allow_refuses_what_is_not_an_allowable_ipv4_network(
    entries: str, path: str, words: str
) -> None:
    manifest, problems = check_manifest(
        f"name: w\nnetwork: full\nnetwork_allow: {entries}\n", ["run.py"]
    )

    assert manifest is None
    assert [p.path for p in problems] == [path]
    assert words in problems[0].message


def test_network_allow_without_network_full_is_refused() -> None:
    manifest, problems = check_manifest("name: w\nnetwork_allow: [10.1.0.0/16]\n", ["run.py"])

    assert manifest is None
    assert [(p.path, p.hint) for p in problems] == [
        ("network_allow", "add network: full, or drop network_allow")
    ]


# -- end to end --------------------------------------------------------------------------------

E2E_WORKER = r"""
import json, socket
def tcp(host, port):
    with socket.socket() as s:
        s.settimeout(3)
        try:
            s.connect((host, port))
            return "connected"
        except OSError as exc:
            return str(exc.errno)
def routed(host, port):  # a route lookup only: UDP sends nothing on connect
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        try:
            s.connect((host, port))
            return True
        except OSError:
            return False
def reach(port):
    # The host's loopback as the sandbox could name it: its own 127.0.0.1, and the gateway
    # slirp4netns maps to the host's (never probed when a route would carry the packet out).
    gateway = "routed" if routed("10.0.2.2", port) else tcp("10.0.2.2", port)
    return {"loopback": tcp("127.0.0.1", port), "gateway": gateway}
inputs = json.load(open("inputs.json"))
outputs = {name: reach(port) for name, port in inputs.items()}
open("result.json", "w").write(json.dumps({"outputs": outputs}))
"""


@needs_bwrap
@needs_netns
def test_a_deployed_worker_with_network_cannot_reach_floom_or_its_database(
    server: LiveServer, api: httpx.Client, tmp_path: Path
) -> None:
    folder = make_worker(
        tmp_path / "prober",
        "name: prober\nnetwork: full\n"
        "inputs: {api: {type: integer}, postgres: {type: integer}}\n"
        "outputs: {api: {type: object}, postgres: {type: object}}\n",
        {"run.py": textwrap.dedent(E2E_WORKER)},
    )
    deploy_folder(api, folder)
    api_port = int(server.base_url.rsplit(":", 1)[1])

    started = api.post(
        "/api/v1/workers/prober/runs", json={"inputs": {"api": api_port, "postgres": 5432}}
    )
    run = wait_for_run(api, started.json()["id"], timeout=60)

    assert run["status"] == "succeeded", run
    blocked = {"loopback": str(errno.ECONNREFUSED), "gateway": str(errno.EHOSTUNREACH)}
    assert run["outputs"] == {"api": blocked, "postgres": blocked}
    assert slirp_processes(server.ctx.settings.data_dir) == []
