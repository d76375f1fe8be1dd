"""Alert channels: an outbound webhook signed as Standard Webhooks, a Slack-compatible
incoming webhook, or email over SMTP. A channel's credentials are secrets of floom's secret
store, which its settings name (and which are never shown back); every setting is checked
when the channel is saved, and a bad one changes nothing."""

from __future__ import annotations

import base64
import binascii
import json
import re
import urllib.parse
from dataclasses import dataclass
from email.utils import parseaddr
from typing import TYPE_CHECKING, Any

from sqlalchemy.exc import IntegrityError
from sqlmodel import col, select

from floom import jsonvalues
from floom.errors import Conflict, InvalidRequest, NotFound, quoted
from floom.hints import Told, act, told
from floom.manifest.schema import NAME_PATTERN, SECRET_NAME_PATTERN, Manifest, Problem
from floom.net.egress import CHECKS, EgressRefused, policy_of, resolve_checked_now
from floom.services.access import secrets
from floom.services.access.principal import Principal
from floom.store.db import session_scope
from floom.store.models import AlertChannel, new_id, utcnow
from floom.vocabulary import ChannelKind

if TYPE_CHECKING:
    from floom.services.context import Context

KINDS: tuple[ChannelKind, ...] = tuple(ChannelKind)
MAX_URL = 2048
MAX_RECIPIENTS = 20
# Hosts the callback URLs of one worker.yml may name (each is resolved when it is checked).
MAX_CALLBACK_HOSTS = 10
# An address as written ("Name <a@b>"): a mail address is at most 254 characters.
MAX_ADDRESS = 254
# Each kind's settings: (key, required, what it holds).
SETTINGS: dict[str, tuple[tuple[str, bool, str], ...]] = {
    "webhook": (
        ("url", True, "the receiver's http(s) URL"),
        ("secret", True, "the secret holding its Standard Webhooks signing key (whsec_...)"),
    ),
    "slack": (("url_secret", True, "the secret holding the incoming webhook's URL"),),
    "email": (
        ("host", True, "the SMTP server's name"),
        ("port", False, "its port (587)"),
        ("starttls", False, "true (default): STARTTLS before anything is sent"),
        ("username", False, "the login, if the server asks for one"),
        ("password_secret", False, "the secret holding the password"),
        ("sender", True, "the From address"),
        ("to", True, "the addresses to send to"),
    ),
}
SECRET_SETTINGS = ("secret", "url_secret", "password_secret")


class ChannelInvalid(InvalidRequest):
    """A channel's settings cannot be used; `details` names the setting."""

    status = 422
    code = "alert_channel_invalid"


def invalid(path: str, message: str, hint: Told) -> ChannelInvalid:
    detail = {"path": path, "message": message, "hint": hint}
    return ChannelInvalid(f"{path}: {message}", hint=hint, details=[detail])


@dataclass(frozen=True)
class Channel:
    """A stored channel, its settings parsed."""

    id: str
    name: str
    kind: str
    config: dict[str, Any]

    @classmethod
    def of(cls, row: AlertChannel) -> Channel:
        config = jsonvalues.stored(row.config_json, expect=dict)
        return cls(id=row.id, name=row.name, kind=row.kind, config=config)


def check_url(ctx: Context, url: Any, path: str, *, asked: Asked | None = None) -> str:
    """An http(s) URL that the egress guard lets floom reach; raises ChannelInvalid naming
    `path` ("config.url", "callback_url") otherwise. Resolves the name now, so a host address
    or a name that does not resolve is refused at once, not at the first delivery."""
    if not isinstance(url, str) or not url.strip():
        raise invalid(path, "must be an http(s) URL", "e.g. https://hooks.example.com/floom")
    url = url.strip()
    if len(url) > MAX_URL:
        raise invalid(path, f"is longer than {MAX_URL} characters", "use a shorter URL")
    try:
        parts = urllib.parse.urlsplit(url)
    except ValueError:  # "http://[::1": a bracket not closed (a 500 if left to rise)
        parts = urllib.parse.SplitResult("", "", "", "", "")
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise invalid(path, f"{_shown(url)} is not an http(s) URL", "e.g. https://example.com/hook")
    if parts.username or parts.password:
        hint = "put credentials in the channel's secret, not in the URL"
        raise invalid(path, "must not carry a user name or password", hint)
    try:
        port = parts.port or (443 if parts.scheme == "https" else 80)
    except ValueError as exc:
        raise invalid(
            path, f"has a bad port ({exc})", "e.g. https://example.com:8443/hook"
        ) from exc
    check_reachable(ctx, parts.hostname, port, path, asked=asked)
    return str(url)


# What the egress guard answered for each (host, port) while one worker.yml is checked.
Asked = dict[tuple[str, int], EgressRefused | None]


def check_reachable(
    ctx: Context, host: str, port: int, path: str, *, asked: Asked | None = None
) -> None:
    """Raise ChannelInvalid naming `path` when the egress guard refuses `host` (a host
    address, a private one, a name that does not resolve in time): every host a channel or
    a callback names is asked when it is saved, not first when something is sent (and
    again then: names move). `asked` keeps the answers of one check of many URLs."""
    key = (host.lower(), port)
    if asked is not None and key in asked:
        refused = asked[key]
    else:
        try:
            resolve_checked_now(host, port, policy_of(ctx.settings), places=CHECKS)
            refused = None
        except EgressRefused as exc:
            refused = exc
        if asked is not None:
            asked[key] = refused
    if refused is not None:
        hint = (
            "check the host name"
            if "cannot resolve" in refused.message or "no address" in refused.message
            else "floom sends only to public addresses (or networks in FLOOM_EGRESS_ALLOW)"
        )
        raise invalid(path, refused.message, hint) from refused


def _shown(url: str) -> str:
    return repr(url[:80])


def _check_secret(ctx: Context, value: Any, path: str, caller: Principal) -> str:
    if not isinstance(value, str) or not re.fullmatch(SECRET_NAME_PATTERN, value):
        hint = told(
            "the NAME of a secret set with ",
            act("secrets set", name="NAME"),
            ", e.g. ALERTS_WEBHOOK_KEY",
        )
        raise invalid(path, f"{value!r} is not a secret name", hint)
    if secrets.missing(ctx, [value], caller=caller):
        raise invalid(
            path, f"no secret named {value}", told("set it first: ", act("secrets set", name=value))
        )
    return value


def check_config(ctx: Context, *, kind: str, config: Any, caller: Principal) -> dict[str, Any]:
    """The channel's settings, checked (secrets named exist and hold what the kind needs;
    URLs are allowed by the egress guard); raises ChannelInvalid naming the setting."""
    caller.require("deploy")
    if kind not in KINDS:
        raise invalid("kind", f"unknown channel kind {kind!r}", f"one of {', '.join(KINDS)}")
    if not isinstance(config, dict):
        raise invalid("config", "must be a mapping of settings", _keys_hint(kind))
    known = {key for key, _, _ in SETTINGS[kind]}
    for key in config:
        if key not in known:
            raise invalid(
                f"config.{key}", f"unknown setting for a {kind} channel", _keys_hint(kind)
            )
    for key, required, _ in SETTINGS[kind]:
        if required and config.get(key) in (None, "", []):
            raise invalid(f"config.{key}", "required", _keys_hint(kind))
    clean: dict[str, Any] = {}
    for key in SECRET_SETTINGS:
        if config.get(key) is not None:
            clean[key] = _check_secret(ctx, config[key], f"config.{key}", caller)
    if kind == ChannelKind.WEBHOOK:
        clean["url"] = check_url(ctx, config["url"], "config.url")
        _check_signing_key(ctx, clean["secret"])
    elif kind == ChannelKind.SLACK:
        _check_secret_url(ctx, clean["url_secret"], "config.url_secret")
    else:
        clean.update(_check_email(config))
        check_reachable(ctx, clean["host"], clean["port"], "config.host")
    return clean


def _check_secret_url(ctx: Context, name: str, path: str) -> None:
    """check_url for the URL a secret holds, refused without quoting it: a secret's value
    (nor its host) is never shown back, not even to whoever names the secret."""
    try:
        check_url(ctx, _secret_value(ctx, name), path)
    except ChannelInvalid as exc:
        refused = "refused" in exc.message and "resolves to" in exc.message
        why = (
            "a URL whose host floom may not send to (not a public address)"
            if refused
            else "a URL floom can send to"
        )
        hint = told(
            "store the incoming webhook's https URL in it: ",
            act("secrets set", name=name),
            " (its value is not shown here)",
        )
        raise invalid(path, f"secret {name} does not hold {why}", hint) from None


# A Standard Webhooks key: whsec_ and the base64 of 24 to 64 bytes, the standard's bounds.
# The library signs with almost any text (it drops what is not base64 and decodes the rest),
# so a key such as "hunter22" was taken, and every receiver checking with the key as written
# refused every alert.
SIGNING_KEY = re.compile(r"whsec_([A-Za-z0-9+/]+)(={0,2})")
SIGNING_KEY_BYTES = (24, 64)
SIGNING_KEY_FORM = "whsec_ followed by the base64 of 24 to 64 random bytes"


def signing_key_bytes(value: str) -> bytes | None:
    """The key a Standard Webhooks secret `value` holds, or None when it is not one. Space
    after it (`echo KEY | floom secrets set`) is taken, as the library signs alike."""
    found = SIGNING_KEY.fullmatch(value.rstrip())
    if found is None:
        return None
    body, padding = found.groups()
    if padding and (len(body) + len(padding)) % 4:
        return None
    try:
        raw = base64.b64decode(body + "=" * (-len(body) % 4), validate=True)
    except binascii.Error:  # a length no base64 has
        return None
    low, high = SIGNING_KEY_BYTES
    return raw if low <= len(raw) <= high else None


def _check_signing_key(ctx: Context, name: str) -> None:
    if signing_key_bytes(_secret_value(ctx, name)) is None:
        hint = told(
            f"store {SIGNING_KEY_FORM} in it (",
            act("secrets set", name=name),
            '; its value is not shown here), e.g. python3 -c "import base64, os; '
            "print('whsec_' + base64.b64encode(os.urandom(32)).decode())\"",
        )
        raise invalid(
            "config.secret",
            f"secret {name} does not hold a Standard Webhooks key ({SIGNING_KEY_FORM})",
            hint,
        )


def _secret_value(ctx: Context, name: str) -> str:
    values, _ = secrets.resolve(ctx, [name])
    return values.get(name, "")


def _check_email(config: dict[str, Any]) -> dict[str, Any]:
    host = config["host"]
    if not isinstance(host, str) or not re.fullmatch(r"[A-Za-z0-9.-]{1,253}", host):
        raise invalid("config.host", f"{host!r} is not a host name", "e.g. smtp.example.com")
    port = config.get("port", 587)
    if not isinstance(port, int) or isinstance(port, bool) or not 1 <= port <= 65535:
        raise invalid("config.port", f"{port!r} is not a port", "e.g. 587 (STARTTLS)")
    starttls = config.get("starttls", True)
    if not isinstance(starttls, bool):
        raise invalid("config.starttls", "must be true or false", "true unless the server is local")
    username = config.get("username")
    if username is not None and (not isinstance(username, str) or len(username) > 254):
        raise invalid("config.username", "must be a login name", "e.g. alerts@example.com")
    if bool(username) != bool(config.get("password_secret")):
        hint = "give both username and password_secret, or neither"
        raise invalid("config.password_secret" if username else "config.username", "missing", hint)
    sender = _address(config["sender"], "config.sender")
    to = config["to"]
    if isinstance(to, str):
        to = [to]
    if not isinstance(to, list) or not 1 <= len(to) <= MAX_RECIPIENTS:
        raise invalid("config.to", "must list 1 to 20 addresses", "e.g. [oncall@example.com]")
    clean: dict[str, Any] = {
        "host": host.lower(),
        "port": port,
        "starttls": starttls,
        "sender": sender,
        "to": [_address(a, f"config.to[{i}]") for i, a in enumerate(to)],
    }
    if username:
        clean["username"] = username
    return clean


def _address(value: Any, path: str) -> str:
    if isinstance(value, str) and len(value) > MAX_ADDRESS:
        # Also before the parser: it recurses once per nested "(", so thousands of them
        # would end in a RecursionError (a 500), not a refusal.
        raise invalid(path, f"is longer than {MAX_ADDRESS} characters", "e.g. alerts@example.com")
    _name, address = parseaddr(value) if isinstance(value, str) else ("", "")
    if not re.fullmatch(r"[^@\s<>,]+@[A-Za-z0-9.-]+", address) or "\n" in str(value):
        raise invalid(path, f"{value!r} is not an email address", "e.g. alerts@example.com")
    return address


def _keys_hint(kind: str) -> str:
    return f"a {kind} channel's settings: " + "; ".join(
        f"{key}{'' if required else ' (optional)'}: {what}"
        for key, required, what in SETTINGS[kind]
    )


def create_channel(
    ctx: Context, *, name: str, kind: str, config: Any, caller: Principal
) -> AlertChannel:
    """Save a new channel. Needs the deploy scope; a bad setting raises ChannelInvalid and
    saves nothing; a taken name raises Conflict."""
    caller.require("deploy")
    _check_name(name)
    clean = check_config(ctx, kind=kind, config=config, caller=caller)
    row = AlertChannel(
        id=new_id("ach"), name=name, kind=ChannelKind(kind), config_json=json.dumps(clean)
    )
    try:
        with session_scope(ctx.engine, write=True) as s:
            caller.require_in(s, "deploy")
            s.add(row)
    except IntegrityError as exc:
        hint = told("pick another name, or ", act("alerts channels rm", name=name), " first")
        raise Conflict(f"an alert channel named {name} exists", hint=hint) from exc
    return row


def update_channel(ctx: Context, *, name: str, config: Any, caller: Principal) -> AlertChannel:
    """Replace a channel's settings (checked as on create). Needs the deploy scope."""
    caller.require("deploy")
    kind = get_channel(ctx, name=name, caller=caller).kind
    clean = check_config(ctx, kind=kind, config=config, caller=caller)
    with session_scope(ctx.engine, write=True) as s:
        caller.require_in(s, "deploy")
        row = s.exec(select(AlertChannel).where(AlertChannel.name == name)).first()
        if row is None:
            raise _no_channel(name)
        row.config_json = json.dumps(clean)
        row.updated_at = utcnow()
        s.add(row)
    return row


# A change made over a concurrent one is merged again over that one, this many times at most.
CHANGE_TRIES = 3


def change_channel(ctx: Context, *, name: str, changes: Any, caller: Principal) -> AlertChannel:
    """Change some of a channel's settings: `changes` is merged over the current ones (a
    setting given as null is removed; a list, as `to`, is replaced whole), and the result is
    checked as on create, so a bad one changes nothing. Needs the deploy scope.

    A change saved meanwhile by another caller is not lost: the merge is made again over it."""
    caller.require("deploy")
    if not isinstance(changes, dict) or not changes:
        raise invalid(
            "config", "give at least one setting to change", 'e.g. {"url": "https://..."}'
        )
    for _ in range(CHANGE_TRIES):
        current = get_channel(ctx, name=name, caller=caller)
        known = {key for key, _, _ in SETTINGS.get(current.kind, ())}
        for key in changes:
            # Also a null one: removing a setting the kind does not have (a misspelt
            # password_secret) would otherwise answer as if it were removed.
            if key not in known:
                raise invalid(
                    f"config.{key}",
                    f"unknown setting for a {current.kind} channel",
                    _keys_hint(current.kind),
                )
        merged = {**jsonvalues.stored(current.config_json, expect=dict), **changes}
        config = {k: v for k, v in merged.items() if v is not None}
        clean = check_config(ctx, kind=current.kind, config=config, caller=caller)
        with session_scope(ctx.engine, write=True) as s:
            caller.require_in(s, "deploy")
            found = select(AlertChannel).where(AlertChannel.name == name).with_for_update()
            row = s.exec(found).first()
            if row is None:
                raise _no_channel(name)
            if row.config_json != current.config_json:
                continue  # changed since it was read: merge over the new settings
            row.config_json = json.dumps(clean)
            row.updated_at = utcnow()
            s.add(row)
            return row
    raise Conflict(
        f"alert channel {name} kept changing while this change was made",
        hint="send the change again",
    )


def _check_name(name: Any) -> None:
    if not isinstance(name, str) or not re.fullmatch(NAME_PATTERN, name):
        hint = "a lowercase slug: letters, digits and dashes, e.g. ops-email"
        raise invalid("name", f"{name!r} is not a channel name", hint)


def _no_channel(name: str) -> NotFound:
    return NotFound(
        f"no alert channel named {quoted(name)}", hint=told(act("alerts channels"), " lists them")
    )


def sees_whole_urls(caller: Principal) -> bool:
    """Whether `caller` is shown a webhook channel's URL and a callback's target whole: only a
    caller who may change channels (many receivers take a token in the path or query)."""
    return caller.can("deploy")


def list_channels(ctx: Context, *, caller: Principal) -> list[AlertChannel]:
    """Every channel, by name. Needs the read scope (settings name secrets, never values)."""
    caller.require("read")
    with session_scope(ctx.engine) as s:
        return list(s.exec(select(AlertChannel).order_by(col(AlertChannel.name))).all())


def get_channel(ctx: Context, *, name: str, caller: Principal) -> AlertChannel:
    caller.require("read")
    with session_scope(ctx.engine) as s:
        row = s.exec(select(AlertChannel).where(AlertChannel.name == name)).first()
    if row is None:
        raise _no_channel(name)
    return row


def delete_channel(ctx: Context, *, name: str, caller: Principal) -> None:
    """Rules naming it keep the name (and skip it) until it exists again. Deploy scope."""
    caller.require("deploy")
    with session_scope(ctx.engine, write=True) as s:
        caller.require_in(s, "deploy")
        row = s.exec(select(AlertChannel).where(AlertChannel.name == name)).first()
        if row is None:
            raise _no_channel(name)
        s.delete(row)


def channel_secrets(ctx: Context, channel: Channel) -> dict[str, str]:
    """The values of the secrets a channel's settings name, by setting."""
    names = {key: channel.config[key] for key in SECRET_SETTINGS if channel.config.get(key)}
    values, _ = secrets.resolve(ctx, names.values())
    return {key: values[name] for key, name in names.items() if name in values}


def trigger_callback_problems(ctx: Context, manifest: Manifest) -> list[Problem]:
    """A problem for each `callback_url` of the manifest's Composio triggers that the egress
    guard refuses (or that does not resolve), at the trigger's path; asked at deploy and
    validate, so a trigger's runs never carry a URL floom may not reach."""
    raw = manifest.triggers if isinstance(manifest.triggers, list) else []
    problems = []
    asked: Asked = {}
    for i, item in enumerate(raw):
        settings = item.get("composio") if isinstance(item, dict) else None
        url = settings.get("callback_url") if isinstance(settings, dict) else None
        if not isinstance(url, str):
            continue
        path = f"triggers[{i}].composio.callback_url"
        host = _host_of(url)
        if host is not None and len(asked) >= MAX_CALLBACK_HOSTS and host not in asked:
            # Each host is resolved while the caller (any read key, for validate) waits.
            message = f"names one host too many: callback URLs name at most {MAX_CALLBACK_HOSTS}"
            problems.append(Problem(path, message, "send several triggers' callbacks to one"))
            continue
        try:
            check_url(ctx, url, path, asked=asked)
        except ChannelInvalid as exc:
            problems.append(Problem(path, exc.message.removeprefix(f"{path}: "), exc.advice))
    return problems


def _host_of(url: str) -> tuple[str, int] | None:
    """The (host, port) a callback URL names, as check_reachable keys it; None if none."""
    try:
        parts = urllib.parse.urlsplit(url.strip())
        port = parts.port or (443 if parts.scheme == "https" else 80)
    except ValueError:
        return None
    return (parts.hostname.lower(), port) if parts.hostname else None
