"""User-mode networking for a sandbox that may use the network: its own network namespace,
reached through slirp4netns, fenced off from the host (its loopback and every address of its
interfaces, in any range) and the private ranges.

The sandbox's namespace gets a tap device that slirp4netns (running on the host) turns into
ordinary host sockets, so the sandbox can talk to the internet like any host program while
the host's own loopback services (floom's API, PostgreSQL) stay out of reach. Routes set
from outside, before the command starts, make every blocked address fail at `connect()` in
the sandbox (EHOSTUNREACH); no packet for it ever reaches slirp4netns.

slirp4netns turns the sandbox's connections into the host's own sockets, so an address of
the host (a public one on its interface included) would reach services bound to 0.0.0.0
there: every address the host answers on is read when the run starts (addresses change)
and fenced like the private ranges, and no `network_allow` opens it. The sandbox has no
IPv6 at all, so no IPv6 address of the host is reachable either.
"""

from __future__ import annotations

import contextlib
import fcntl
import ipaddress
import os
import select
import shutil
import signal
import subprocess
import time
from collections.abc import Iterable
from typing import Final

from floom.errors import FloomError, InvalidRequest
from floom.net.addresses import host_networks
from floom.sandbox.local import procfs
from floom.sandbox.local.cgroups import CgroupError, RunCgroup
from floom.sandbox.local.supervisor import open_init_pidfd

# slirp4netns's fixed virtual network: the sandbox is 10.0.2.100, the gateway 10.0.2.2 (which
# it maps to the host's loopback unless told not to) and its DNS forwarder 10.0.2.3.
SLIRP_NETWORK: Final = ipaddress.IPv4Network("10.0.2.0/24")
SLIRP_GATEWAY: Final = "10.0.2.2"
SLIRP_DNS: Final = "10.0.2.3"
SANDBOX_DEVICE: Final = "tap0"
SANDBOX_RESOLV_CONF: Final = f"nameserver {SLIRP_DNS}\n".encode()
"""The sandbox's /etc/resolv.conf: slirp4netns's DNS forwarder. The host's own resolver
usually sits on its loopback or a private address, both out of the sandbox's reach."""
OFFLINE_RESOLV_CONF: Final = b"# no network: this worker's worker.yml has network: none\n"
"""/etc/resolv.conf of a sandbox without network: no resolver, and nothing of the host's
(its servers and search domains say where the host is)."""

# Addresses no sandbox reaches unless its manifest allows them: the host's own and private
# networks, carrier-grade NAT, link-local (cloud metadata lives at 169.254.169.254),
# multicast and the reserved rest. IPv6 is switched off in the sandbox altogether.
BLOCKED_NETWORKS: Final = tuple(
    ipaddress.IPv4Network(cidr)
    for cidr in (
        "0.0.0.0/8",
        "10.0.0.0/8",
        "100.64.0.0/10",
        "127.0.0.0/8",
        "169.254.0.0/16",
        "172.16.0.0/12",
        "192.0.0.0/24",
        "192.168.0.0/16",
        "198.18.0.0/15",
        "224.0.0.0/4",
        "240.0.0.0/4",
    )
)
# Networks a manifest can never open: the host's loopback (slirp4netns refuses it anyway)
# and slirp4netns's own network, whose addresses stand for the host.
NEVER_ALLOWED: Final = (ipaddress.IPv4Network("127.0.0.0/8"), SLIRP_NETWORK)

# The routing table that holds the one route to the DNS forwarder, chosen by rules that
# match only port 53: slirp4netns forwards every port of 10.0.2.3 to the host's resolver
# address, which must not become a way to reach other services there.
_DNS_TABLE: Final = 53
_NS_GET_USERNS: Final = 0xB701  # ioctl: the user namespace that owns a namespace
SLIRP_OWNER_VARIABLE: Final = "FLOOM_SLIRP_FOR"
"""In the environment of every slirp4netns floom starts: the run's work dir, so that a later
executor can recognise (and kill) the ones a killed predecessor left behind."""
SETUP_TIMEOUT_SECONDS: Final = 10.0
STOP_WAIT_SECONDS: Final = 2.0
ALLOW_HINT: Final = "list IPv4 networks in CIDR form, e.g. network_allow: [10.1.2.0/24]"
_PATH: Final = "/usr/sbin:/usr/bin:/sbin:/bin"
_TOOLS: Final = ("slirp4netns", "nsenter", "ip", "bwrap", "setpriv", "unshare", "cat")
INSTALL_HINT: Final = (
    "install slirp4netns, iproute2, util-linux and bubblewrap: apt-get install slirp4netns"
)
SLIRP_CAPABILITIES: Final = (
    "CAP_SYS_ADMIN",  # the sandbox's network namespace
    "CAP_NET_ADMIN",  # the tap device
)
"""What a root floom's slirp4netns starts with as a uid of its own, ambient, until it joins
its user namespace (see _unprivileged_slirp); setpriv needs CAP_SETUID and CAP_SETGID too."""
ROOT_SLIRP_CAPABILITIES: Final = (
    *SLIRP_CAPABILITIES,
    "CAP_SETPCAP",  # its own sandbox empties its bounding set
    "CAP_NET_BIND_SERVICE",  # the one its own sandbox keeps
)
"""What slirp4netns starts with as uid 0 (a root floom without a sandbox uid range), before
its --enable-sandbox drops them."""


class NetworkSetupFailed(FloomError):
    """The sandbox's network could not be set up, so the run was not started."""

    status = 503
    code = "sandbox_network_unavailable"


def parse_allowed_network(entry: object) -> ipaddress.IPv4Network:
    """One allowlist entry ("10.213.0.0/24", or an address for a single host) as a network;
    raises ValueError saying what is wrong with it."""
    if not isinstance(entry, str):
        raise ValueError(f"expected an IPv4 network such as 10.1.2.0/24, got {entry!r}")
    try:
        network = ipaddress.ip_network(entry.strip())
    except ValueError as exc:
        if "host bits set" in str(exc):
            wider = ipaddress.ip_network(entry.strip(), strict=False)
            raise ValueError(f"{entry!r} has host bits set; the network is {wider}") from exc
        raise ValueError(f"{entry!r} is not an IPv4 network such as 10.1.2.0/24") from exc
    if not isinstance(network, ipaddress.IPv4Network):
        raise ValueError(f"{entry!r} is IPv6; sandboxes have no IPv6")
    for closed in NEVER_ALLOWED:
        if network.subnet_of(closed):
            raise ValueError(f"{entry!r} lies in {closed}, which a sandbox never reaches")
    return network


def blocked_networks(allow: Iterable[ipaddress.IPv4Network]) -> list[ipaddress.IPv4Network]:
    """BLOCKED_NETWORKS minus what `allow` opens; NEVER_ALLOWED stays closed whatever is
    allowed (a route to a more specific network wins over a wider one)."""
    pieces = list(BLOCKED_NETWORKS)
    for opened in allow:
        remaining: list[ipaddress.IPv4Network] = []
        for piece in pieces:
            if piece.subnet_of(opened):
                continue
            if opened.subnet_of(piece):
                remaining.extend(piece.address_exclude(opened))
            else:
                remaining.append(piece)
        pieces = remaining
    for closed in NEVER_ALLOWED:
        if not any(closed.subnet_of(piece) for piece in pieces):
            pieces.append(closed)
    return sorted(pieces)


def route_commands(
    allow: Iterable[ipaddress.IPv4Network], host: Iterable[ipaddress.IPv4Network] = ()
) -> str:
    """The `ip -batch` script that fences a namespace slirp4netns has just configured.

    The connected /24 goes (every other address in it is the host); the default route names
    the gateway `onlink`, so the gateway itself needs no route and stays unreachable; DNS
    reaches 10.0.2.3 on port 53 only. `host` (the host's own IPv4 networks, see
    host_networks) stays unreachable whatever `allow` opens: a route to it is at least as
    specific as any allowed network around it, and added last.
    """
    lines = [
        f"route del {SLIRP_NETWORK} dev {SANDBOX_DEVICE}",
        f"route replace default via {SLIRP_GATEWAY} dev {SANDBOX_DEVICE} onlink",
        f"route add {SLIRP_DNS}/32 dev {SANDBOX_DEVICE} scope link table {_DNS_TABLE}",
    ]
    for pref, proto in ((100, "udp"), (101, "tcp")):
        lines.append(
            f"rule add pref {pref} to {SLIRP_DNS}/32 ipproto {proto} dport 53 lookup {_DNS_TABLE}"
        )
    lines += [f"route replace unreachable {net}" for net in blocked_networks(allow)]
    lines += [f"route replace unreachable {net}" for net in sorted(set(host))]
    return "\n".join(lines) + "\n"


def host_ipv4_networks() -> list[ipaddress.IPv4Network]:
    """The host's own IPv4 networks, read now; raises NetworkSetupFailed when the kernel
    does not say (the run must not start unfenced)."""
    try:
        found = host_networks()
    except OSError as exc:
        raise NetworkSetupFailed(f"cannot fence the host's own addresses: {exc}") from exc
    return [net for net in found if isinstance(net, ipaddress.IPv4Network)]


class UserNetworking:
    """A running slirp4netns serving one sandbox's network namespace.

    `close` ends it (SIGTERM, then SIGKILL if it lingers; bounded) and is idempotent.
    Should floom die instead, slirp4netns sees its exit fd close and exits too.
    """

    def __init__(self, proc: subprocess.Popen[bytes], exit_fd: int) -> None:
        self.proc = proc
        self._exit_fd: int | None = exit_fd
        self.slirp_pidfd = -1
        """slirp4netns's own pidfd where bubblewrap confines it (proc is bubblewrap's)."""

    @property
    def pid(self) -> int:
        return self.proc.pid

    def close(self) -> None:
        if self._exit_fd is not None:
            os.close(self._exit_fd)
            self._exit_fd = None
        if self.proc.poll() is None:
            # Its namespace ended with the run: nothing is left to wind down gracefully.
            # A pidfd tells the moment it has gone; Popen.wait's timed polling adds ~30 ms.
            try:
                pidfd = os.pidfd_open(self.proc.pid)
            except OSError:
                pidfd = None  # it already ended; wait() below reaps it
            try:
                if self.slirp_pidfd >= 0:
                    # Its exit fd just closed: slirp4netns ends, and bubblewrap with it.
                    # Killing bubblewrap first would hand slirp4netns to floom to reap.
                    select.select([self.slirp_pidfd], [], [], STOP_WAIT_SECONDS)
                    with contextlib.suppress(OSError):
                        signal.pidfd_send_signal(self.slirp_pidfd, signal.SIGKILL)
                else:
                    self.proc.terminate()
                if pidfd is not None and not select.select([pidfd], [], [], STOP_WAIT_SECONDS)[0]:
                    self.proc.kill()
            finally:
                if pidfd is not None:
                    os.close(pidfd)
        self.proc.wait()
        if self.slirp_pidfd >= 0:
            procfs.reap_if_ours(self.slirp_pidfd, STOP_WAIT_SECONDS)
            os.close(self.slirp_pidfd)
            self.slirp_pidfd = -1
        if self.proc.stderr is not None:
            self.proc.stderr.close()


def attach_user_networking(
    child_pid: int,
    *,
    allow: Iterable[str] = (),
    owner: str,
    cgroup: RunCgroup | None = None,
    system_binds: tuple[str, ...],
    uid: int | None = None,
) -> UserNetworking:
    """Give the network namespace of `child_pid` user-mode networking, fenced; call it after
    the namespace exists and before the sandboxed command starts.

    `allow` lists networks (see parse_allowed_network) the sandbox may reach besides the
    public internet. `owner` is the run's work dir: it goes into slirp4netns's environment
    (see SLIRP_OWNER_VARIABLE). `cgroup` is the run's: slirp4netns joins it before it
    serves the sandbox, so what the run's traffic makes it use (memory for buffers, CPU)
    counts against the run's limits and ends with the run. `system_binds` are bubblewrap's
    read-only binds of the host's system directories (the sandboxes' own), for slirp4netns's
    confinement. `uid` (a root floom's): the host uid slirp4netns serves the sandbox as, one
    no other process uses (a lease of the sandbox uid pool, never the run's own); None, as
    root, leaves it uid 0 (a root floom without a sandbox uid range, as only tests make).
    The tools that fence the namespace run with floom's rights, before the command starts:
    what they are handed (argv, environment, working directory "/") holds no byte the
    worker chose; allowed networks reach them only as the addresses floom parsed, written
    anew. slirp4netns, which parses the sandbox's packets as long as it runs, is confined
    too (see _confined_slirp).
    Raises NetworkSetupFailed (having stopped what it started) when a tool is missing or
    any step fails; the caller must then not start the command.
    """
    try:
        allowed = [parse_allowed_network(entry) for entry in allow]
    except ValueError as exc:
        raise InvalidRequest(f"network_allow: {exc}", hint=ALLOW_HINT) from exc
    tools = {name: shutil.which(name) for name in _TOOLS}
    missing = sorted(name for name, path in tools.items() if path is None)
    found = {name: path for name, path in tools.items() if path is not None}
    if missing:
        raise NetworkSetupFailed(
            f"a worker with network needs {', '.join(missing)}, which is not on PATH",
            hint=INSTALL_HINT,
        )
    host = host_ipv4_networks()
    _await_loopback(child_pid)
    namespaces = _SandboxNamespaces(child_pid)
    try:
        networking = _start_slirp(
            namespaces,
            owner=owner,
            tools=found,
            cgroup=cgroup,
            system_binds=system_binds,
            uid=uid,
        )
        try:
            _fence(namespaces, allowed, host, nsenter=found["nsenter"])
        except BaseException:
            networking.close()
            raise
    finally:
        namespaces.close()
    return networking


def _await_loopback(child_pid: int) -> None:
    """Wait until bwrap has brought the sandbox's loopback up, its last change to the
    namespace: netlink changes made meanwhile make its own fail ("loopback: Failed
    RTM_NEWADDR"). A device is listed in the namespace's igmp table once it is up."""
    deadline = time.monotonic() + SETUP_TIMEOUT_SECONDS
    while True:
        try:
            with open(f"/proc/{child_pid}/net/igmp") as table:
                if any(line.split()[1:2] == ["lo"] for line in table):
                    return
        except OSError as exc:
            message = f"the sandbox ended before its network was set up: {exc}"
            raise NetworkSetupFailed(message) from exc
        if time.monotonic() > deadline:
            raise NetworkSetupFailed(
                f"the sandbox's loopback did not come up within {SETUP_TIMEOUT_SECONDS:g} s",
                hint="the node may be overloaded; try again",
            )
        time.sleep(0.001)


class _SandboxNamespaces:
    """Open handles on the sandbox's network namespace and, when floom is not root, the
    user namespace that owns it; tools get them as /proc/self/fd paths, so a pid reused
    meanwhile cannot redirect them."""

    def __init__(self, child_pid: int) -> None:
        try:
            self.net = os.open(f"/proc/{child_pid}/ns/net", os.O_RDONLY | os.O_CLOEXEC)
        except OSError as exc:
            raise NetworkSetupFailed(f"the sandbox's network namespace is gone: {exc}") from exc
        self.user: int | None = None
        if os.geteuid() != 0:
            # Without root, floom acts through the user namespace bwrap created as floom's
            # user; the owner of the network namespace, which may sit above pid 1's own.
            try:
                self.user = fcntl.ioctl(self.net, _NS_GET_USERNS)
            except OSError as exc:
                os.close(self.net)
                raise NetworkSetupFailed(
                    f"cannot open the sandbox's user namespace: {exc}"
                ) from exc

    @property
    def fds(self) -> tuple[int, ...]:
        return (self.net,) if self.user is None else (self.net, self.user)

    def close(self) -> None:
        for fd in self.fds:
            os.close(fd)


def _start_slirp(
    namespaces: _SandboxNamespaces,
    *,
    owner: str,
    tools: dict[str, str],
    cgroup: RunCgroup | None,
    system_binds: tuple[str, ...],
    uid: int | None,
) -> UserNetworking:
    ready_r, ready_w = os.pipe()
    exit_r, exit_w = os.pipe()
    info_r, info_w = -1, -1
    holder: _UserNamespaceHolder | None = None
    target = ["--netns-type=path", f"/proc/self/fd/{namespaces.net}"]
    passed: tuple[int, ...] = namespaces.fds
    try:
        if namespaces.user is not None:
            # Unprivileged, slirp4netns runs as floom's user anyway. Its --enable-sandbox
            # would need uid 0 mapped in the sandbox's user namespace, which bwrap does not
            # map (measured: "setegid(0)" and no network).
            wrapper: list[str] = []
            confinement = [f"--userns-path=/proc/self/fd/{namespaces.user}"]
        elif uid is None:
            info_r, info_w = os.pipe()
            wrapper = _confined_slirp(tools, info_w, system_binds)
            confinement = ["--enable-sandbox"]
        else:
            holder = _UserNamespaceHolder(namespaces, uid, tools)
            info_r, info_w = os.pipe()
            wrapper = _unprivileged_slirp(tools, info_w, system_binds, uid, holder.pid)
            # The child (which makes the tap) stays in the host's user namespace: /dev/null
            # is no namespace, and slirp4netns ignores that join failing. Its parent joins
            # the holder's (see _unprivileged_slirp).
            confinement = ["--enable-sandbox", "--userns-path=/dev/null"]
            target = ["--netns-type=pid", str(holder.pid)]
            passed = ()
    except BaseException:
        for fd in (ready_r, ready_w, exit_r, exit_w, info_r, info_w):
            if fd >= 0:
                os.close(fd)
        if holder is not None:
            holder.close()
        raise
    argv = [
        *wrapper,
        tools["slirp4netns"],
        "--configure",
        "--mtu=65520",
        "--disable-host-loopback",
        "--enable-seccomp",
        *confinement,
        f"--ready-fd={ready_w}",
        f"--exit-fd={exit_r}",
        *target,
        SANDBOX_DEVICE,
    ]
    try:
        proc = subprocess.Popen(
            argv,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
            pass_fds=tuple(fd for fd in (ready_w, exit_r, info_w, *passed) if fd >= 0),
            env={"PATH": _PATH, SLIRP_OWNER_VARIABLE: os.path.realpath(owner)},
            cwd="/",
        )
    except OSError as exc:
        for fd in (ready_r, exit_w, info_r):
            if fd >= 0:
                os.close(fd)
        if holder is not None:
            holder.close()
        raise NetworkSetupFailed(f"could not start slirp4netns: {exc}", hint=INSTALL_HINT) from exc
    finally:
        for fd in (ready_w, exit_r, info_w):
            if fd >= 0:
                os.close(fd)
    assert proc.stderr is not None
    os.set_blocking(proc.stderr.fileno(), False)
    networking = UserNetworking(proc, exit_w)
    try:
        slirp_pid = proc.pid
        if info_r >= 0:
            networking.slirp_pidfd = _await_slirp_pidfd(info_r, proc)
            slirp_pid = procfs.pid_of(networking.slirp_pidfd)
        if cgroup is not None:
            # Before it is ready, so before the sandbox's first packet: all it does for the
            # run is counted there (what it allocated while starting stays floom's).
            try:
                cgroup.add(slirp_pid)
            except CgroupError as exc:
                raise NetworkSetupFailed(
                    f"slirp4netns cannot join the run's cgroup: {exc}"
                ) from exc
        _await_ready(ready_r, proc)
    except BaseException:
        networking.close()
        raise
    finally:
        os.close(ready_r)
        if info_r >= 0:
            os.close(info_r)
        if holder is not None:
            # Ready means slirp4netns joined the holder's user namespace: it has served its
            # turn, and ends before the sandbox's first packet.
            holder.close()
    return networking


class _UserNamespaceHolder:
    """A process in the sandbox's network namespace and in a new user namespace that `uid`
    owns, where uid and gid 0 stand for `uid` (`cat`, as `uid`, echoing one byte to say it
    is there, then waiting for its input to end): the target slirp4netns is pointed at (see
    _unprivileged_slirp). It gets nothing but that byte from floom, and ends when floom
    closes its input or dies."""

    def __init__(self, namespaces: _SandboxNamespaces, uid: int, tools: dict[str, str]) -> None:
        argv = [
            tools["nsenter"],
            f"--net=/proc/self/fd/{namespaces.net}",
            "--",
            *(tools["setpriv"], f"--reuid={uid}", f"--regid={uid}", "--clear-groups"),
            *("--no-new-privs", "--"),
            *(tools["unshare"], "--user", "--map-root-user", "--", tools["cat"]),
        ]
        try:
            self.proc = subprocess.Popen(
                argv,
                stdin=subprocess.PIPE,
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                pass_fds=(namespaces.net,),
                env={"PATH": _PATH},
                cwd="/",
            )
        except OSError as exc:
            raise NetworkSetupFailed(
                f"could not start slirp4netns's user namespace: {exc}", hint=INSTALL_HINT
            ) from exc
        assert self.proc.stdin is not None
        assert self.proc.stdout is not None
        try:
            try:
                self.proc.stdin.write(b"1")
                self.proc.stdin.flush()
                readable = select.select([self.proc.stdout], [], [], SETUP_TIMEOUT_SECONDS)[0]
                echoed = bool(readable) and os.read(self.proc.stdout.fileno(), 1) == b"1"
            except OSError:
                echoed = False  # it ended before reading (a broken pipe)
            if not echoed:
                raise NetworkSetupFailed(
                    f"slirp4netns's user namespace could not be made{self._stderr_tail()}",
                    hint="the kernel must let a uid create a user namespace "
                    "(sysctl user.max_user_namespaces above 0; on Ubuntu, "
                    "kernel.apparmor_restrict_unprivileged_userns=0)",
                )
        except BaseException:
            self.close()
            raise

    @property
    def pid(self) -> int:
        return self.proc.pid

    def close(self) -> None:
        """End it (closing its input; SIGKILL if it lingers) and reap it; idempotent."""
        for stream in (self.proc.stdin, self.proc.stdout, self.proc.stderr):
            if stream is not None and not stream.closed:
                with contextlib.suppress(OSError):
                    stream.close()
        try:
            self.proc.wait(STOP_WAIT_SECONDS)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()

    def _stderr_tail(self) -> str:
        self.proc.kill()
        self.proc.wait()
        assert self.proc.stderr is not None
        lines = self.proc.stderr.read().decode("utf-8", "replace").strip().splitlines()
        return f": {lines[-1]}" if lines else f" (exit status {self.proc.returncode})"


def _confined_slirp(
    tools: dict[str, str], info_fd: int, system_binds: tuple[str, ...]
) -> list[str]:
    """The bubblewrap command line a root floom without a sandbox uid range starts
    slirp4netns under, as uid 0.

    slirp4netns's --enable-sandbox drops every capability but CAP_NET_BIND_SERVICE, sets
    no_new_privs and pivots into an empty root with /etc and /run; its --enable-seccomp
    refuses execve, ptrace, mount, setns, unshare and the like. uid 0 needs no capability
    to signal root's processes (kill(-1) would reach all of them) nor to read root's files.
    So it runs here as pid 1 of a PID namespace of its own, where no host process has a
    pid, and sees of the host's files only the system directories, the /etc entries
    programs need and the host's resolv.conf (its DNS forwarder's upstream), no /run: no
    root socket, no /etc/shadow. A private mount namespace also keeps the unmount of its
    old root from reaching the host's shared mounts (measured: it took every /run/netns/*
    namespace with it). With a uid range, _unprivileged_slirp is used instead."""
    return _slirp_bwrap(
        tools["bwrap"],
        info_fd,
        system_binds,
        caps=ROOT_SLIRP_CAPABILITIES,
        proc=("--proc", "/proc"),
    )


def _unprivileged_slirp(
    tools: dict[str, str], info_fd: int, system_binds: tuple[str, ...], uid: int, holder: int
) -> list[str]:
    """The command line (bubblewrap, then setpriv) a root floom starts slirp4netns under as
    `uid`, with no capability on the host once it serves packets.

    slirp4netns 1.2 forks a child that enters the sandbox's network namespace, makes the tap
    device and hands it over; that needs CAP_SYS_ADMIN and CAP_NET_ADMIN in the host's user
    namespace, which owns the sandbox's network namespace, so setpriv starts it as `uid`
    with those two ambient (and no other capability, group or uid 0 anywhere). Its
    --enable-sandbox, run as a uid other than 0, makes the parent join the user namespace of
    its target pid (the holder's, `holder`: in the sandbox's network namespace, owned by
    `uid`, mapping uid 0 to it) and become uid 0 there, before it serves any packet. A
    process that joins a user namespace keeps no capability in the one it left and can
    never go back: its capabilities of the host's are gone. Then its own sandbox pivots into
    an empty root with /etc and /run (in a mount namespace that user namespace owns), drops
    every capability but CAP_NET_BIND_SERVICE (of its user namespace, which owns no network
    namespace: it binds no low port on the host) and sets no_new_privs; --enable-seccomp
    refuses execve, ptrace, mount, setns, unshare and the like. It stays `uid` on the host:
    it can signal and read nothing of root's nor of another run's.

    Before that, bubblewrap confines it as _confined_slirp does (own PID namespace, only the
    system directories and the /etc entries programs need, no /run), with only the holder's
    /proc entry, which it reads as the holder's uid to find the two namespaces."""
    proc = ("--dir", "/proc", "--ro-bind", f"/proc/{holder}", f"/proc/{holder}")
    caps = (*SLIRP_CAPABILITIES, "CAP_SETUID", "CAP_SETGID")
    ambient = ",".join(f"+{cap.removeprefix('CAP_').lower()}" for cap in SLIRP_CAPABILITIES)
    return [
        *_slirp_bwrap(tools["bwrap"], info_fd, system_binds, caps=caps, proc=proc),
        *(tools["setpriv"], f"--reuid={uid}", f"--regid={uid}", "--clear-groups"),
        *(f"--inh-caps=-all,{ambient}", f"--ambient-caps=-all,{ambient}", "--"),
    ]


def _slirp_bwrap(
    bwrap: str,
    info_fd: int,
    system_binds: tuple[str, ...],
    *,
    caps: tuple[str, ...],
    proc: tuple[str, ...],
) -> list[str]:
    """bubblewrap's command line for slirp4netns: pid 1 of its own PID namespace, seeing the
    system directories, the /etc entries programs need, the host's resolv.conf and
    /dev/net/tun, with `caps` and `proc` (its /proc)."""
    added: list[str] = ["--cap-drop", "ALL"]
    for cap in caps:
        added += ["--cap-add", cap]
    resolv = os.path.realpath("/etc/resolv.conf")
    return [
        bwrap,
        *("--unshare-pid", "--as-pid-1", "--unshare-ipc", "--unshare-uts"),
        *("--unshare-cgroup-try", "--die-with-parent", "--new-session", *added),
        *system_binds,
        *(("--ro-bind", resolv, "/etc/resolv.conf") if os.path.isfile(resolv) else ()),
        *proc,
        *("--dev", "/dev", "--perms", "0755", "--dir", "/dev/net"),
        *("--dev-bind", "/dev/net/tun", "/dev/net/tun"),
        *("--tmpfs", "/tmp", "--dir", "/run", "--remount-ro", "/", "--chdir", "/"),
        *("--info-fd", str(info_fd), "--"),
    ]


def _await_slirp_pidfd(info_fd: int, proc: subprocess.Popen[bytes]) -> int:
    """slirp4netns's pidfd, from bubblewrap's report of the pid it started."""
    info = b""
    deadline = time.monotonic() + SETUP_TIMEOUT_SECONDS
    while (left := deadline - time.monotonic()) > 0 and select.select([info_fd], [], [], left)[0]:
        chunk = os.read(info_fd, 4096)
        if not chunk:
            break
        info += chunk
        if (pidfd := open_init_pidfd(info)) is not None:
            return pidfd
    raise NetworkSetupFailed(f"slirp4netns failed to start{_stderr_tail(proc)}", hint=INSTALL_HINT)


def protection_summary(*, own_uid: bool) -> str:
    """What a run with network gets on this node, for the sandbox's protections report;
    `own_uid`: slirp4netns serves each run as a uid of its own (a root floom with a sandbox
    uid range)."""
    missing = [name for name in _TOOLS if shutil.which(name) is None]
    if missing:
        return f"unavailable ({', '.join(missing)} missing): runs with network cannot start"
    helper = "slirp4netns"
    if own_uid:
        helper += " as a uid of its own, no capability of the host's"
    return f"user-mode ({helper}), the host's loopback and own addresses and private ranges blocked"


def is_floom_slirp(pid: str, argv: list[bytes], work_root: bytes) -> bool:
    """Whether process `pid`, running `argv`, is a slirp4netns floom started for a run
    under `work_root` (a resolved path ending in a slash)."""
    return floom_slirp_owner(pid, argv, work_root) is not None


def floom_slirp_owner(pid: str, argv: list[bytes], work_root: bytes) -> bytes | None:
    """The work dir (under `work_root`) of the run a slirp4netns process `pid` serves, or
    None when it is not one floom started there."""
    if os.path.basename(argv[0]) != b"slirp4netns":
        return None
    return owner_in_environ(pid, SLIRP_OWNER_VARIABLE, work_root)


def owner_in_environ(pid: str, variable: str, work_root: bytes) -> bytes | None:
    """The value of `variable` in the environment process `pid` started with, when it is a
    path under `work_root`; None otherwise."""
    try:
        with open(f"/proc/{pid}/environ", "rb") as f:
            environ = f.read().split(b"\0")
    except OSError:
        return None  # it ended, or it is not ours to read
    prefix = variable.encode() + b"=" + work_root
    owner = next((v for v in environ if v.startswith(prefix)), None)
    return None if owner is None else owner.split(b"=", 1)[1]


def _await_ready(ready_fd: int, proc: subprocess.Popen[bytes]) -> None:
    ready, _, _ = select.select([ready_fd], [], [], SETUP_TIMEOUT_SECONDS)
    if ready and os.read(ready_fd, 1) == b"1":
        return
    detail = _stderr_tail(proc)
    if not ready:
        raise NetworkSetupFailed(
            f"slirp4netns did not get ready within {SETUP_TIMEOUT_SECONDS:g} s{detail}",
            hint="the node may be overloaded; try again",
        )
    raise NetworkSetupFailed(f"slirp4netns failed to start{detail}", hint=INSTALL_HINT)


def _fence(
    namespaces: _SandboxNamespaces,
    allow: Iterable[ipaddress.IPv4Network],
    host: Iterable[ipaddress.IPv4Network],
    *,
    nsenter: str,
) -> None:
    enter = [nsenter, f"--net=/proc/self/fd/{namespaces.net}"]
    if namespaces.user is not None:
        enter += [f"--user=/proc/self/fd/{namespaces.user}", "--preserve-credentials"]
    # No IPv6 in the sandbox: slirp4netns would not carry it, and a link-local address
    # would only invite probing the tap device.
    script = (
        "if [ -d /proc/sys/net/ipv6 ]; then "
        "echo 1 > /proc/sys/net/ipv6/conf/all/disable_ipv6 && "
        "echo 1 > /proc/sys/net/ipv6/conf/default/disable_ipv6 || exit 1; fi; "
        "exec ip -batch -"
    )
    try:
        done = subprocess.run(
            [*enter, "--", "sh", "-c", script],
            input=route_commands(allow, host).encode(),
            pass_fds=namespaces.fds,
            capture_output=True,
            timeout=SETUP_TIMEOUT_SECONDS,
            env={"PATH": _PATH, "LC_ALL": "C"},
            cwd="/",
        )
    except (OSError, subprocess.TimeoutExpired) as exc:
        raise NetworkSetupFailed(f"could not fence the sandbox's network: {exc}") from exc
    if done.returncode != 0:
        reason = done.stderr.decode("utf-8", "replace").strip()[-500:]
        raise NetworkSetupFailed(
            f"could not fence the sandbox's network: {reason or f'exit {done.returncode}'}",
            hint="the node's kernel must support policy routing rules with ports (Linux 4.17+)",
        )


def _stderr_tail(proc: subprocess.Popen[bytes]) -> str:
    """slirp4netns's last words, once it is gone, for the error message."""
    proc.kill()
    try:
        proc.wait(STOP_WAIT_SECONDS)
        assert proc.stderr is not None
        data = os.read(proc.stderr.fileno(), 65536)
    except (subprocess.TimeoutExpired, BlockingIOError):
        data = b""
    lines = data.decode("utf-8", "replace").strip().splitlines()
    return f": {lines[-1]}" if lines else f" (exit status {proc.returncode})"
