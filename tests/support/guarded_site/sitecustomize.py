"""The test session's guard against name lookups that would leave the machine: a name that
/etc/hosts does not hold fails at once as unknown, as an unresolvable name does. The test
process installs it (tests/conftest.py), and puts this folder on the PYTHONPATH of the
processes tests start, where Python imports this module as `sitecustomize` at start-up: a
floom server or node in a subprocess is held to the same rule. Tests only, never shipped."""

from __future__ import annotations

import ipaddress
import socket
from collections.abc import Callable
from pathlib import Path
from typing import Any

REFUSED = "Name or service not known (tests resolve only names in /etc/hosts)"
"""What a guarded lookup fails with: the resolver's own words, and where they came from."""


def names_in_etc_hosts() -> set[str]:
    try:
        lines = Path("/etc/hosts").read_text().splitlines()
    except OSError:
        return {"localhost"}
    return {name.lower() for line in lines for name in line.split("#")[0].split()[1:]}


def _numeric(host: str) -> bool:
    try:
        ipaddress.ip_address(host.split("%")[0])
    except ValueError:
        return False
    return True


def install() -> Callable[[], None]:
    """Guard socket.getaddrinfo in this process; answers the call that puts it back."""
    real = socket.getaddrinfo
    local = names_in_etc_hosts() | {"localhost"}

    def getaddrinfo(host: Any, *args: Any, **kwargs: Any) -> Any:
        if isinstance(host, bytes):
            host = host.decode(errors="replace")
        if isinstance(host, str) and not _numeric(host) and host.lower().rstrip(".") not in local:
            raise socket.gaierror(socket.EAI_NONAME, REFUSED)
        return real(host, *args, **kwargs)

    def undo() -> None:
        socket.getaddrinfo = real

    socket.getaddrinfo = getaddrinfo
    return undo


if __name__ == "sitecustomize":  # imported by Python at start-up, from the PYTHONPATH
    install()
