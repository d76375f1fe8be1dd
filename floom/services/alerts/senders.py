"""How one delivery goes out: a signed webhook POST (an alert to a webhook channel, or a
run's callback), a Slack-compatible POST, or a mail. Every connection goes through the
egress guard (floom/net/egress.py), pinned to the address it checked; no redirect is
followed. A failure raises AlertUndeliverable, in floom's words (never what the other end said)."""

from __future__ import annotations

import base64
import contextlib
import json
import re
import smtplib
import socket
import ssl
import threading
import urllib.parse
from datetime import UTC, datetime
from email.message import EmailMessage
from email.utils import formatdate, parseaddr
from typing import TYPE_CHECKING, Any

from standardwebhooks.webhooks import Webhook

from floom.errors import FloomError
from floom.hints import Told, act, told
from floom.invisible import CONTROLS, UNSHOWN, escapes
from floom.jsonvalues import UNREADABLE
from floom.net.egress import (
    EgressPolicy,
    describe_failure,
    guarded_client,
    policy_of,
    resolve_checked_now,
)
from floom.services.alerts.channels import (
    SIGNING_KEY_FORM,
    Channel,
    channel_secrets,
    signing_key_bytes,
)
from floom.vocabulary import ChannelKind

if TYPE_CHECKING:
    from floom.services.context import Context

USER_AGENT = "floom-alerts"
MAX_SUBJECT = 150
# A webhook send (connect, TLS, the answer's status) ends within this many alert timeouts;
# the delivery's lease (deliveries._lease_seconds) is longer.
SEND_BUDGET = 2
# Never in a mail header or a Slack line: control characters, line separators.
_CONTROL = re.compile(r"[\x00-\x1f\x7f\u2028\u2029]")
# What a worker wrote (its error message) goes on the line floom gives it: line breaks and
# control characters as Python escapes (newline -> `\n`), and what reorders or hides text
# (floom/invisible.py) as `\uXXXX`, so no text of theirs starts a line that poses as floom's
# ("*floom*: worker x recovered", a "run_url:" of another address).
_ONE_LINE: dict[int, str] = escapes([*CONTROLS, *UNSHOWN])
_ONE_LINE.update({ord("\n"): "\\n", ord("\r"): "\\r", ord("\t"): "\\t"})


class AlertUndeliverable(FloomError):
    """A test alert (or a re-send) could not be delivered; the message says why."""

    status = 502
    code = "alert_undeliverable"

    def __init__(self, message: Told, *, permanent: bool = False, **kwargs: Any) -> None:
        super().__init__(message, **kwargs)
        # Not tried again (a deleted channel, a secret gone, a server without STARTTLS).
        self.permanent = permanent


def callback_key(ctx: Context) -> str:
    """The Standard Webhooks key that signs run callbacks (whsec_...): derived from the
    server's secret key, so every node signs alike; an admin reads it to verify them."""
    raw = ctx.secret_box.derive_key("run-callbacks")[:32]
    return "whsec_" + base64.b64encode(raw).decode()


def send_callback(ctx: Context, *, delivery_id: str, url: str, body: str) -> None:
    _post(ctx, url, body, delivery_id=delivery_id, key=callback_key(ctx))


def send_alert(ctx: Context, *, delivery_id: str, channel: Channel, body: dict[str, Any]) -> None:
    if UNREADABLE in channel.config:
        raise AlertUndeliverable(
            told(
                f"the settings of channel {channel.name} are stored in a form floom cannot read; "
                "set them again (",
                act("alerts channels add", name=channel.name),
                ")",
            ),
            permanent=True,
        )
    values = channel_secrets(ctx, channel)
    wanted = [k for k in ("secret", "url_secret", "password_secret") if channel.config.get(k)]
    missing = [channel.config[k] for k in wanted if k not in values]
    if missing:
        raise AlertUndeliverable(
            f"secret {missing[0]} of channel {channel.name} is not set any more", permanent=True
        )
    if channel.kind == ChannelKind.WEBHOOK:
        if signing_key_bytes(values["secret"]) is None:  # replaced since the channel was saved
            raise AlertUndeliverable(
                f"secret {channel.config['secret']} of channel {channel.name} does not hold a "
                f"Standard Webhooks key ({SIGNING_KEY_FORM})",
                permanent=True,
            )
        text = json.dumps(body, separators=(",", ":"))
        _post(ctx, channel.config["url"], text, delivery_id=delivery_id, key=values["secret"])
    elif channel.kind == ChannelKind.SLACK:
        _post(
            ctx,
            values["url_secret"],
            json.dumps({"text": slack_text(body)}),
            delivery_id=None,
            key=None,
            url_secret=channel.config["url_secret"],
        )
    else:
        send_mail(
            ctx,
            channel=channel,
            password=values.get("password_secret"),
            body=body,
            delivery_id=delivery_id,
        )


def _post(
    ctx: Context,
    url: str,
    text: str,
    *,
    delivery_id: str | None,
    key: str | None,
    url_secret: str | None = None,
) -> None:
    """POST `text` to `url`; AlertUndeliverable saying why not. When the URL is a secret's
    value (`url_secret` names it), the reason never quotes its host, which the guard's words
    would: a delivery's error is shown to every read key."""
    headers = {"Content-Type": "application/json", "User-Agent": USER_AGENT}
    if key is not None and delivery_id is not None:
        stamp = datetime.now(UTC)
        headers["webhook-id"] = delivery_id
        headers["webhook-timestamp"] = str(int(stamp.timestamp()))
        headers["webhook-signature"] = Webhook(key).sign(delivery_id, stamp, text)
    policy = policy_of(ctx.settings)
    # The whole send has a deadline, not only each read: a receiver that sends its answer a
    # byte at a time would otherwise hold the alert loop (every alert and callback of this
    # node) for hours. At the deadline the connection is shut, which ends any read.
    budget = ctx.settings.alert_timeout_seconds * SEND_BUDGET
    connections: list[socket.socket] = []
    cut = threading.Event()

    def trace(event: str, info: dict[str, Any]) -> None:
        if event == "connection.connect_tcp.complete":
            sock = info["return_value"].get_extra_info("socket")
            if sock is not None:
                connections.append(sock)
                if cut.is_set():
                    _shut(sock)

    def at_deadline() -> None:
        cut.set()
        for sock in connections:
            _shut(sock)

    watchdog = threading.Timer(budget, at_deadline)
    watchdog.daemon = True
    watchdog.start()
    try:
        # Only the status is wanted: the answer's body is never read, so a receiver that
        # answers without end (or slowly) holds neither memory nor this sender.
        with (
            guarded_client(
                policy, timeout=ctx.settings.alert_timeout_seconds, follow_redirects=False
            ) as client,
            client.stream(
                "POST", url, content=text.encode(), headers=headers, extensions={"trace": trace}
            ) as response,
        ):
            status = response.status_code
    except Exception as exc:  # a transport error, or the guard's refusal (a FloomError): both
        # are this delivery's failure, said in floom's words
        reason = describe_failure(exc)
        if cut.is_set():
            reason = f"it did not answer within {budget:g} s"
        if url_secret is not None:
            reason = _without_host(reason, url, f"the host in secret {url_secret}")
        raise AlertUndeliverable(reason) from exc
    finally:
        watchdog.cancel()
    if not 200 <= status < 300:
        raise AlertUndeliverable(f"it answered HTTP {status}")


def _shut(sock: socket.socket) -> None:
    with contextlib.suppress(OSError):  # closed already
        sock.shutdown(socket.SHUT_RDWR)


def _without_host(reason: str, url: str, instead: str) -> str:
    try:
        host = urllib.parse.urlsplit(url).hostname
    except ValueError:
        host = None
    if not host:
        return reason
    return re.sub(re.escape(host), instead, reason, flags=re.IGNORECASE)


def summary_line(body: dict[str, Any]) -> str:
    summary = str(body.get("summary") or body.get("type") or "floom alert")
    return _CONTROL.sub(" ", summary)


def slack_text(body: dict[str, Any]) -> str:
    """The Slack message: every part escaped as Slack asks (&, <, >), so that what a worker
    wrote (its error message) shows as written, never as a mention of everyone (<!channel>)
    or a link whose text says another address (<https://a|https://b>)."""
    lines = [f"*floom*: {_slack_escaped(summary_line(body))}"]
    error = body.get("error") or {}
    if error.get("code"):
        message = _slack_escaped(_theirs(error.get("message")))
        lines.append(f"error `{_slack_escaped(str(error['code']))}`: {message}")
    if body.get("run_url"):
        lines.append(_slack_escaped(str(body["run_url"])))
    return "\n".join(lines)


def _theirs(text: object) -> str:
    return str(text or "").translate(_ONE_LINE)


def _slack_escaped(text: str) -> str:
    return text.replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;")


def mail_text(body: dict[str, Any]) -> str:
    lines = [summary_line(body), ""]
    for key in ("worker", "run_url", "subject"):
        if body.get(key):
            lines.append(f"{key}: {body[key]}")
    error = body.get("error") or {}
    if error:
        lines.append(f"error: {error.get('code') or ''} {_theirs(error.get('message'))}".rstrip())
    lines += ["", json.dumps(body, indent=2)]
    return "\n".join(lines)


class _GuardedSMTP(smtplib.SMTP):
    """smtplib's client whose connection goes to the address the egress guard checked, while
    the server's name stays the one STARTTLS verifies its certificate against."""

    def __init__(self, policy: EgressPolicy, *, host: str, timeout: float) -> None:
        self._policy = policy
        self._cut = False
        self._connection: socket.socket | None = None
        super().__init__(timeout=timeout)  # connects in `connect`, once it can be cut
        self._host = host  # the name STARTTLS checks (smtplib keeps the constructor's)

    def cut(self) -> None:
        """Shut the connection, now or as soon as it is made (from another thread): any read
        or write waiting on it ends. STARTTLS wraps it in a socket of its own: both are shut."""
        self._cut = True
        for sock in (self._connection, self.sock):
            if sock is not None:
                _shut(sock)

    def _get_socket(self, host: str, port: int, timeout: float) -> socket.socket:
        address = resolve_checked_now(host, port, self._policy)
        self._connection = socket.create_connection((address, port), timeout)
        if self._cut:
            _shut(self._connection)
        return self._connection


def message_id(delivery_id: str, sender: object) -> str:
    """The Message-ID of a delivery's mail: the same on every try of it, so a mail sent again
    after its first try's end went unrecorded (a node killed once the server took it, an
    answer after the deadline) is one message to the receiver's mail system, which keeps
    one copy of a Message-ID; a re-sent delivery is a new one, with a new id."""
    _name, address = parseaddr(sender) if isinstance(sender, str) else ("", "")
    domain = address.rpartition("@")[2]
    if not re.fullmatch(r"[A-Za-z0-9.-]+", domain):  # a row written by another program
        domain = "floom.invalid"
    return f"<{delivery_id}@{domain}>"


def send_mail(
    ctx: Context,
    *,
    channel: Channel,
    password: str | None,
    body: dict[str, Any],
    delivery_id: str,
) -> None:
    config = channel.config
    message = EmailMessage()
    message["Message-ID"] = message_id(delivery_id, config["sender"])
    message["Date"] = formatdate(usegmt=True)
    message["From"] = config["sender"]
    message["To"] = ", ".join(config["to"])
    message["Subject"] = f"[floom] {summary_line(body)}"[:MAX_SUBJECT]
    message.set_content(mail_text(body))
    stage = "connecting"
    # The whole exchange has a deadline, not only each read (as send_webhook's): a server
    # that says its lines a byte at a time would otherwise hold the alert loop for hours.
    budget = ctx.settings.alert_timeout_seconds * SEND_BUDGET
    smtp = _GuardedSMTP(
        policy_of(ctx.settings), host=config["host"], timeout=ctx.settings.alert_timeout_seconds
    )
    cut = threading.Event()

    def at_deadline() -> None:
        cut.set()
        smtp.cut()

    watchdog = threading.Timer(budget, at_deadline)
    watchdog.daemon = True
    watchdog.start()
    try:
        code, said = smtp.connect(config["host"], config.get("port", 587))
        try:
            if cut.is_set():  # a greeting cut off at the deadline reads as a short one
                raise smtplib.SMTPServerDisconnected("cut off at the deadline")
            if code != 220:  # as smtplib.SMTP(host) checks it
                raise smtplib.SMTPConnectError(code, said)
            if config.get("starttls", True):
                stage = "starting TLS"
                smtp.starttls(context=ssl.create_default_context())
            if config.get("username"):
                stage = "logging in"
                smtp.login(config["username"], password or "")
            stage = "sending"
            smtp.send_message(message)
        finally:
            try:
                smtp.quit()
            except (smtplib.SMTPException, OSError):
                smtp.close()
    except Exception as exc:
        if cut.is_set():
            raise AlertUndeliverable(
                f"the mail server did not finish within {budget:g} s (while {stage})"
            ) from exc
        raise _mail_failure(exc, stage) from exc
    finally:
        watchdog.cancel()


def _mail_failure(exc: Exception, stage: str) -> AlertUndeliverable:
    """What went wrong with a mail delivery, in floom's words."""
    if isinstance(exc, smtplib.SMTPAuthenticationError):
        return AlertUndeliverable(f"the mail server refused the login (SMTP {exc.smtp_code})")
    if isinstance(exc, smtplib.SMTPNotSupportedError):
        return AlertUndeliverable("the mail server does not offer STARTTLS", permanent=True)
    if isinstance(exc, smtplib.SMTPResponseException):
        return AlertUndeliverable(f"the mail server answered SMTP {exc.smtp_code} while {stage}")
    if isinstance(exc, smtplib.SMTPServerDisconnected):
        return AlertUndeliverable(f"the mail server closed the connection while {stage}")
    if isinstance(exc, ssl.SSLError):
        return AlertUndeliverable(f"TLS with the mail server failed ({exc.reason or 'handshake'})")
    # a refused address (a FloomError), a socket error, and the like
    return AlertUndeliverable(f"{describe_failure(exc)} while {stage}")
