"""Named secrets, encrypted at rest; values leave only to enter a sandbox that declared them."""

from __future__ import annotations

import base64
import hashlib
import hmac
import json
import os
import re
from collections.abc import Iterable, Mapping
from contextlib import nullcontext
from typing import TYPE_CHECKING, Any
from urllib.parse import quote, quote_plus

from sqlmodel import Session, select

from floom.errors import (
    InvalidRequest,
    NotFound,
    SecretNameRefused,
    SecretUndecryptable,
    quoted,
)
from floom.hints import act, told
from floom.hints import cli as cli_hints
from floom.sandbox import env_names
from floom.services.access.principal import Principal
from floom.store.db import session_scope
from floom.store.models import Secret, utcnow

if TYPE_CHECKING:
    from cryptography.fernet import Fernet

    from floom.config import Settings
    from floom.services.context import Context

NAME_RE = re.compile(r"^[A-Z_][A-Z0-9_]{0,127}$")
MIN_VALUE_LENGTH = 4
LINE_FORM_LENGTH = 8
REDACTED = "***"


class SecretBox:
    """Fernet encryption with a key from FLOOM_SECRET_KEY or a 0600 key file."""

    def __init__(self, key_material: bytes) -> None:
        self._material = key_material
        self._cipher: Fernet | None = None

    @property
    def _fernet(self) -> Fernet:
        # Built at the first use: cryptography (its own OpenSSL) costs a node about 6 MiB
        # resident, which a node that never reads or writes a secret need not pay.
        if self._cipher is None:
            from cryptography.fernet import Fernet

            key = base64.urlsafe_b64encode(hashlib.sha256(self._material).digest())
            self._cipher = Fernet(key)
        return self._cipher

    def derive_key(self, purpose: str) -> bytes:
        """A key for another use (e.g. signing cookies), independent of the encryption key."""
        return hmac.new(self._material, b"floom:" + purpose.encode(), hashlib.sha256).digest()

    @classmethod
    def from_settings(cls, settings: Settings) -> SecretBox:
        if settings.secret_key:
            return cls(settings.secret_key.encode())
        path = settings.secret_key_file
        if not path.exists():
            fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
            with os.fdopen(fd, "wb") as f:
                f.write(base64.urlsafe_b64encode(os.urandom(32)))
        return cls(path.read_bytes().strip())

    def encrypt(self, value: str) -> bytes:
        return self._fernet.encrypt(value.encode())

    def decrypt(self, token: bytes) -> str:
        from cryptography.fernet import InvalidToken  # loaded by _fernet

        try:
            return self._fernet.decrypt(token).decode()
        except InvalidToken as exc:
            raise SecretUndecryptable(
                "a stored secret cannot be decrypted with this server's key",
                hint="start every floom node with the same FLOOM_SECRET_KEY (or the same "
                "secret.key file) that stored the secrets, or set the secret again",
            ) from exc


def check_name(name: str) -> None:
    """Raise InvalidRequest for a name that is not one, SecretNameRefused for a name that
    would change how the run's programs load or run (floom/sandbox/env_names.py)."""
    if not NAME_RE.fullmatch(name):
        raise InvalidRequest(
            f"'{quoted(name)}' is not a valid secret name",
            hint="use upper-case letters, digits and underscores, e.g. GITHUB_TOKEN",
        )
    if why := env_names.refusal(name):
        raise SecretNameRefused(
            f"{why}; a secret becomes an environment variable of the run's process",
            hint=env_names.RENAME_HINT,
        )


def set_secret(ctx: Context, *, name: str, value: str, caller: Principal) -> None:
    """Store (or replace) a secret's value, encrypted. Needs the deploy scope (checked again
    in the writing transaction)."""
    caller.require("deploy")
    check_name(name)
    if len(value) < MIN_VALUE_LENGTH:
        raise InvalidRequest(
            f"the value of {name} is shorter than {MIN_VALUE_LENGTH} characters",
            hint="floom redacts secret values from logs and outputs; values this short "
            "cannot be redacted without destroying the logs",
        )
    size = len(name) + 2 + len(value.encode())
    if size > env_names.MAX_ENTRY_BYTES:
        raise InvalidRequest(
            f"the value of {name} is {len(value.encode())} bytes: a secret becomes an "
            f"environment variable, which holds at most {env_names.MAX_ENTRY_BYTES} bytes "
            "with its name",
            hint="keep large values in a file of the worker's bundle or pass them as inputs",
        )
    with session_scope(ctx.engine, write=True) as s:
        caller.require_in(s, "deploy")
        row = s.get(Secret, name)
        if row is None:
            s.add(Secret(name=name, ciphertext=ctx.secret_box.encrypt(value)))
        else:
            row.ciphertext = ctx.secret_box.encrypt(value)
            row.updated_at = utcnow()
            s.add(row)


def delete_secret(ctx: Context, *, name: str, caller: Principal) -> None:
    """Needs the deploy scope (checked again in the deleting transaction)."""
    caller.require("deploy")
    with session_scope(ctx.engine, write=True) as s:
        caller.require_in(s, "deploy")
        row = s.get(Secret, name)
        if row is None:
            raise NotFound(
                f"no secret named {quoted(name)}",
                hint=told(act("secrets list"), " shows the names"),
            )
        s.delete(row)


def list_secrets(ctx: Context, *, caller: Principal) -> list[dict[str, Any]]:
    """The secrets' names and dates, never their values. Needs the deploy scope: even the
    names tell what a deployment talks to."""
    caller.require("deploy")
    with session_scope(ctx.engine) as s:
        rows = s.exec(select(Secret).order_by(Secret.name)).all()
        return [
            {"name": r.name, "created_at": r.created_at, "updated_at": r.updated_at} for r in rows
        ]


def missing(ctx: Context, names: Iterable[str], *, caller: Principal) -> list[str]:
    """The names among `names` that no secret is stored under (nothing is decrypted). Needs
    the deploy scope, as the names do."""
    caller.require("deploy")
    wanted = list(dict.fromkeys(names))
    if not wanted:
        return []
    with session_scope(ctx.engine) as s:
        q = select(Secret.name).where(Secret.name.in_(wanted))  # type: ignore[attr-defined]
        found = set(s.exec(q).all())
    return [n for n in wanted if n not in found]


def refused_for_runs(names: Iterable[str]) -> str | None:
    """Why a run may not be given the secrets `names`, or None: a name refused since it was
    stored or deployed (floom/sandbox/env_names.py) never reaches a run, which fails saying how to
    rename it. Nothing is decrypted."""
    for name in dict.fromkeys(names):
        if why := env_names.refusal(name):
            # A run's error, stored as the CLI writes it; each surface reads it in its terms.
            return cli_hints.written(
                told(
                    f"secret {name} cannot be given to a run: {why}. Rename it: ",
                    act("secrets set", name="NEW_NAME"),
                    f", list NEW_NAME instead of {name} in worker.yml and deploy, then ",
                    act("secrets rm", name=name),
                )
            )
    return None


def resolve(
    ctx: Context, names: Iterable[str], *, s: Session | None = None
) -> tuple[dict[str, str], list[str]]:
    """The values of the named secrets, and the names that are not set; read in `s` when
    given (a step inside a write transaction: another connection would wait on the pool
    while it holds the write lock)."""
    wanted = list(dict.fromkeys(names))
    if not wanted:
        return {}, []
    with nullcontext(s) if s is not None else session_scope(ctx.engine) as session:
        rows = session.exec(select(Secret).where(Secret.name.in_(wanted))).all()  # type: ignore[attr-defined]
        found = {r.name: ctx.secret_box.decrypt(r.ciphertext) for r in rows}
    return found, [n for n in wanted if n not in found]


class Redactor:
    """Replaces secret values with *** in text and in JSON-like values: each value as it is
    and in the forms programs (and floom itself) commonly write it (`written_forms`)."""

    def __init__(self, values: Iterable[str]) -> None:
        forms = {form for v in values if v for form in written_forms(v)}
        self._values = sorted(forms, key=len, reverse=True)

    @property
    def values(self) -> tuple[str, ...]:
        """The values redacted, longest first (for scanning bytes in other encodings)."""
        return tuple(self._values)

    def text(self, text: str) -> str:
        for v in self._values:
            if v in text:
                text = text.replace(v, REDACTED)
        return text

    def cut_tail(self, text: str) -> str:
        """For text that was cut short: mask a secret's beginning left at its end, which
        `text` cannot recognise once the rest of the value is gone."""
        stripped = text.rstrip("\ufffd")  # a cut through a multi-byte character
        for v in self._values:
            for n in range(min(len(v) - 1, len(stripped)), 0, -1):
                if stripped.endswith(v[:n]):
                    return stripped[:-n] + REDACTED
        return text

    def value(self, value: Any) -> Any:
        if not self._values:
            return value
        if isinstance(value, str):
            return self.text(value)
        if isinstance(value, Mapping):
            return {self.text(str(k)): self.value(v) for k, v in value.items()}
        if isinstance(value, list | tuple):
            return [self.value(v) for v in value]
        if isinstance(value, int | float) and not isinstance(value, bool):
            # A secret of digits (a PIN, an account number) written as a JSON number is
            # the same bytes once stored as JSON: masked as in a string, the whole number.
            shown = repr(value) if isinstance(value, float) else _digits(value)
            return REDACTED if shown is not None and self.text(shown) != shown else value
        return value


def written_forms(value: str) -> set[str]:
    """The value, and how it reads once written the common ways: escaped inside a JSON
    string (ASCII-only or not, the slash escaped or not), percent-encoded in a URL or a
    form, and, for a value of several lines (a PEM key), each line of LINE_FORM_LENGTH
    characters or more, since logs are stored a line at a time (a shorter line would mask
    common words everywhere).
    Forms shorter than MIN_VALUE_LENGTH are left out, as such values are refused."""
    forms = {
        value,
        json.dumps(value)[1:-1],
        json.dumps(value, ensure_ascii=False)[1:-1],
        # PHP's json_encode and some others escape the slash too.
        json.dumps(value)[1:-1].replace("/", "\\/"),
        quote(value, safe=""),
        quote(value),
        quote_plus(value),
    }
    if "\n" in value or "\r" in value:
        lines = (line.strip() for line in value.splitlines())
        forms.update(line for line in lines if len(line) >= LINE_FORM_LENGTH)
    return {f for f in forms if len(f) >= MIN_VALUE_LENGTH}


def _digits(value: int) -> str | None:
    """An integer as JSON writes it; None past the digits CPython converts (4,300, which
    no value floom stores exceeds: jsonvalues refuses longer ones)."""
    try:
        return str(value)
    except ValueError:
        return None
