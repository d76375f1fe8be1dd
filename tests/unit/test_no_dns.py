"""The test session's guard against name lookups that would leave the machine
(tests/conftest.py): a name /etc/hosts does not hold fails at once as unknown, in the test
process and in the processes it starts; loopback names and addresses resolve as ever."""

from __future__ import annotations

import socket
import subprocess
import sys

import pytest

from tests.support.guarded_site.sitecustomize import REFUSED


def test_a_name_outside_etc_hosts_is_not_asked_of_a_name_server() -> None:
    with pytest.raises(socket.gaierror):
        socket.getaddrinfo("smtp.example.com", 25)
    with pytest.raises(socket.gaierror):
        socket.create_connection(("mail.example.com", 25), timeout=1)


def test_loopback_names_and_addresses_resolve() -> None:
    assert socket.getaddrinfo("localhost", 80, type=socket.SOCK_STREAM)
    assert socket.getaddrinfo("127.0.0.1", 80, type=socket.SOCK_STREAM)[0][4][0] == "127.0.0.1"
    assert socket.getaddrinfo("::1", 80, type=socket.SOCK_STREAM)


def test_a_process_a_test_starts_is_guarded_too() -> None:
    # The session puts tests/support/guarded_site on the PYTHONPATH that processes started
    # by tests inherit (floom servers and nodes, the CLI): Python runs its sitecustomize.
    probe = (
        "import socket\n"
        "try:\n    socket.getaddrinfo('smtp.example.com', 25)\n"
        "except socket.gaierror as exc:\n    print(exc.strerror)\n"
        "print(socket.getaddrinfo('127.0.0.1', 80)[0][4][0])"
    )
    done = subprocess.run(
        [sys.executable, "-c", probe], capture_output=True, text=True, timeout=60, check=True
    )
    assert done.stdout.splitlines() == [REFUSED, "127.0.0.1"]
