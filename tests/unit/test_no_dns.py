"""The test session's guard against name lookups that would leave the machine
(tests/conftest.py): a name /etc/hosts does not hold fails at once as unknown; loopback names
and addresses resolve as ever."""

from __future__ import annotations

import socket

import pytest


def test_a_name_outside_etc_hosts_is_not_asked_of_a_name_server() -> None:
    with pytest.raises(socket.gaierror):
        socket.getaddrinfo("smtp.example.com", 25)
    with pytest.raises(socket.gaierror):
        socket.create_connection(("mail.example.com", 25), timeout=1)


def test_loopback_names_and_addresses_resolve() -> None:
    assert socket.getaddrinfo("localhost", 80, type=socket.SOCK_STREAM)
    assert socket.getaddrinfo("127.0.0.1", 80, type=socket.SOCK_STREAM)[0][4][0] == "127.0.0.1"
    assert socket.getaddrinfo("::1", 80, type=socket.SOCK_STREAM)
