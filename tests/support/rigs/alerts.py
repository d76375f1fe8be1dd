"""Real receivers for alert and callback deliveries: an HTTP endpoint on loopback that fails,
hangs or accepts as a test tells it, and a real SMTP server (aiosmtpd) with STARTTLS and
AUTH, whose certificate the test trusts through SSL_CERT_FILE."""

from __future__ import annotations

import datetime as dt
import ipaddress
import json
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

from floom.services.context import Context
from tests.standins.http import STOP_POLL_SECONDS
from tests.support.harness import fast_settings, wait_until


@dataclass
class Receiver:
    """What the endpoint does with each request, in order (then `then`): an HTTP status to
    answer, or "hang" (answer after `hang_seconds`, or once `released`; the endpoint's end
    releases them). Accepted requests are kept."""

    url: str = ""
    plan: list[int | str] = field(default_factory=list)
    then: int | str = 200
    hang_seconds: float = 3.0
    accepted: list[tuple[dict[str, str], bytes]] = field(default_factory=list)
    tried: int = 0
    lock: threading.Lock = field(default_factory=threading.Lock)
    released: threading.Event = field(default_factory=threading.Event)

    def next_answer(self) -> int | str:
        with self.lock:
            self.tried += 1
            return self.plan.pop(0) if self.plan else self.then

    def bodies(self) -> list[dict[str, Any]]:
        return [json.loads(body) for _, body in self.accepted]

    def wait_for(self, count: int, timeout: float = 20) -> list[dict[str, Any]]:
        wait_until(lambda: len(self.accepted) >= count, timeout=timeout)
        return self.bodies()


@contextmanager
def receiver(*, port: int = 0, **options: Any) -> Iterator[Receiver]:
    """An endpoint on loopback (on `port`, to stand for one that was down and is back)."""
    state = Receiver(**options)

    class Handler(BaseHTTPRequestHandler):
        def do_POST(self) -> None:
            body = self.rfile.read(int(self.headers.get("Content-Length") or 0))
            answer = state.next_answer()
            if answer == "hang":
                state.released.wait(state.hang_seconds)
                answer = 200
            if answer == 200:
                with state.lock:
                    state.accepted.append(({k.lower(): v for k, v in self.headers.items()}, body))
            self.send_response(int(answer))
            self.send_header("Content-Length", "0")
            self.end_headers()

        def log_message(self, *args: Any) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", port), Handler)
    server.daemon_threads = True
    thread = threading.Thread(target=server.serve_forever, args=(STOP_POLL_SECONDS,), daemon=True)
    thread.start()
    state.url = f"http://127.0.0.1:{server.server_address[1]}/hook"
    try:
        yield state
    finally:
        state.released.set()
        server.shutdown()
        server.server_close()


def self_signed(tmp: Path, name: str) -> tuple[Path, Path]:
    """A certificate for `name` (and 127.0.0.1) and its key, as PEM files."""
    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import NameOID

    key = ec.generate_private_key(ec.SECP256R1())
    subject = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, name)])
    now = dt.datetime.now(dt.UTC)
    cert = (
        x509.CertificateBuilder()
        .subject_name(subject)
        .issuer_name(subject)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - dt.timedelta(minutes=5))
        .not_valid_after(now + dt.timedelta(hours=1))
        .add_extension(
            x509.SubjectAlternativeName(
                [x509.DNSName(name), x509.IPAddress(ipaddress.ip_address("127.0.0.1"))]
            ),
            critical=False,
        )
        .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
        .sign(key, hashes.SHA256())
    )
    cert_path, key_path = tmp / "smtp.pem", tmp / "smtp.key"
    cert_path.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    key_path.write_bytes(
        key.private_bytes(
            serialization.Encoding.PEM,
            serialization.PrivateFormat.PKCS8,
            serialization.NoEncryption(),
        )
    )
    return cert_path, key_path


@dataclass
class MailServer:
    port: int
    cert: Path
    messages: list[Any] = field(default_factory=list)
    logins: list[tuple[str, str]] = field(default_factory=list)


@contextmanager
def smtp_server(tmp: Path, *, name: str, user: str, password: str) -> Iterator[MailServer]:
    """aiosmtpd on loopback: STARTTLS required before AUTH, AUTH required before mail."""
    import ssl

    from aiosmtpd.controller import Controller
    from aiosmtpd.smtp import AuthResult, Envelope, LoginPassword

    from tests.support.ports import free_port

    cert, key = self_signed(tmp, name)
    context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    context.load_cert_chain(cert, key)
    port = free_port()
    server = MailServer(port=port, cert=cert)

    class Handler:
        async def handle_DATA(self, _server: Any, _session: Any, envelope: Envelope) -> str:
            from email import message_from_bytes

            server.messages.append(message_from_bytes(envelope.content))  # type: ignore[arg-type]
            return "250 OK"

    def authenticator(
        _server: Any, _session: Any, _envelope: Any, mechanism: str, data: Any
    ) -> AuthResult:
        if isinstance(data, LoginPassword):
            login = (data.login.decode(), data.password.decode())
            server.logins.append(login)
            return AuthResult(success=login == (user, password))
        return AuthResult(success=False)

    controller = Controller(
        Handler(),
        hostname="127.0.0.1",
        port=port,
        tls_context=context,
        require_starttls=True,
        authenticator=authenticator,
        auth_required=True,
        auth_require_tls=True,
    )
    controller.start()
    try:
        yield server
    finally:
        controller.stop()


@contextmanager
def mail_host_context(tmp_path: Path, database_url: str, host: str) -> Iterator[Context]:
    """The suite's context, with loopback allowed and `host` (an email channel's, which the
    egress guard resolves when the channel is saved) resolved to it."""
    settings = fast_settings(
        tmp_path / "data",
        database_url,
        agent_http_allow_private=True,
        agent_http_resolve=f"{host}=127.0.0.1",
    )
    context = Context.open(settings)
    try:
        yield context
    finally:
        context.engine.dispose()
