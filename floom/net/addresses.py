"""The addresses this host answers on, read from the kernel when asked: every address of
every interface, in any range, and any other local route, IPv4 and IPv6.

Both fences that keep a worker's traffic off the host use it: the sandbox's network
(floom/sandbox/local/network.py) and the egress guard of connections floom makes on a worker's
behalf (floom/net/egress.py). Addresses change (DHCP, a new interface, a VPN), so callers read
them for each run or connection; one read is one netlink dump of the kernel's `local`
routing table, about 0.1 ms.
"""

from __future__ import annotations

import contextlib
import ipaddress
import os
import socket
import struct
from typing import Final

Network = ipaddress.IPv4Network | ipaddress.IPv6Network

# linux/rtnetlink.h and linux/netlink.h
_RTM_GETROUTE: Final = 26
_RTM_NEWROUTE: Final = 24
_NLMSG_ERROR: Final = 2
_NLMSG_DONE: Final = 3
_NLM_F_REQUEST: Final = 0x1
_NLM_F_DUMP: Final = 0x300
_RTA_DST: Final = 1
_RTA_TABLE: Final = 15
_RT_TABLE_LOCAL: Final = 255
_SOL_NETLINK: Final = 270
_NETLINK_GET_STRICT_CHK: Final = 12
# Route types whose destination is this host: its addresses (and routes such as
# `ip route add local 198.51.100.0/24 dev lo`), their broadcast addresses, IPv6 anycast.
_RTN_LOCAL: Final = 2
_RTN_BROADCAST: Final = 3
_RTN_ANYCAST: Final = 4
_HOST_TYPES: Final = frozenset({_RTN_LOCAL, _RTN_BROADCAST, _RTN_ANYCAST})
_HEADER: Final = struct.Struct("=IHHII")
_RTMSG: Final = struct.Struct("=BBBBBBBBI")
_RTATTR: Final = struct.Struct("=HH")


def host_networks() -> tuple[Network, ...]:
    """Every destination this host delivers to itself, as networks (an address is a /32 or
    /128): the kernel's `local` table, in this process's network namespace. Raises OSError
    when it cannot be read; callers then refuse (fail closed)."""
    try:
        with socket.socket(
            socket.AF_NETLINK, socket.SOCK_RAW | socket.SOCK_CLOEXEC, socket.NETLINK_ROUTE
        ) as sock:
            # Asks the kernel to filter the dump by table; older kernels ignore it (the
            # table is then checked here), so a failure to set it changes nothing.
            with contextlib.suppress(OSError):
                sock.setsockopt(_SOL_NETLINK, _NETLINK_GET_STRICT_CHK, 1)
            sock.bind((0, 0))
            request = _RTMSG.pack(socket.AF_UNSPEC, 0, 0, 0, _RT_TABLE_LOCAL, 0, 0, 0, 0)
            seq = int.from_bytes(os.urandom(4), "little")
            header = _HEADER.pack(
                _HEADER.size + len(request), _RTM_GETROUTE, _NLM_F_REQUEST | _NLM_F_DUMP, seq, 0
            )
            sock.sendall(header + request)
            return tuple(_read_dump(sock, seq))
    except OSError as exc:
        raise OSError(f"cannot read this host's addresses: {exc}") from exc


def _read_dump(sock: socket.socket, seq: int) -> list[Network]:
    found: dict[Network, None] = {}
    while True:
        data = sock.recv(1 << 16)
        if not data:
            raise OSError("the kernel's route dump ended early")
        offset = 0
        while offset + _HEADER.size <= len(data):
            length, kind, _, msg_seq, _ = _HEADER.unpack_from(data, offset)
            if length < _HEADER.size:
                raise OSError("a malformed netlink message")
            body = data[offset + _HEADER.size : offset + length]
            offset += (length + 3) & ~3
            if msg_seq != seq:
                continue
            if kind == _NLMSG_DONE:
                return list(found)
            if kind == _NLMSG_ERROR:
                (code,) = struct.unpack_from("=i", body)
                if code:
                    raise OSError(f"the kernel refused the route dump: {os.strerror(-code)}")
                continue
            if kind == _RTM_NEWROUTE:
                network = _host_route(body)
                if network is not None:
                    found[network] = None


def _host_route(body: bytes) -> Network | None:
    """The destination of one route message, when it is a route to this host."""
    if len(body) < _RTMSG.size:
        return None
    family, dst_len, _, _, table, _, _, kind, _ = _RTMSG.unpack_from(body)
    if kind not in _HOST_TYPES or family not in (socket.AF_INET, socket.AF_INET6):
        return None
    destination = b""
    offset = _RTMSG.size
    while offset + _RTATTR.size <= len(body):
        length, attr = _RTATTR.unpack_from(body, offset)
        if length < _RTATTR.size:
            break
        value = body[offset + _RTATTR.size : offset + length]
        if attr == _RTA_DST:
            destination = value
        elif attr == _RTA_TABLE and len(value) == 4:
            (table,) = struct.unpack("=I", value)
        offset += (length + 3) & ~3
    if table != _RT_TABLE_LOCAL:
        return None
    size = 4 if family == socket.AF_INET else 16
    if len(destination) != size:
        # No destination: the whole family (`local default`), which is every address.
        destination, dst_len = bytes(size), 0
    address = ipaddress.ip_address(destination)
    return ipaddress.ip_network(f"{address}/{dst_len}", strict=False)
