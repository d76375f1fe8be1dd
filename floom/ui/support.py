"""The web UI's plumbing: templates and their filters, the session cookie, CSRF checks, and a
route class that turns floom's errors into pages (or a sign-in redirect) instead of JSON."""

from __future__ import annotations

import functools
import json
import secrets
from collections.abc import Callable, Coroutine
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Annotated, Any
from urllib.parse import quote

from fastapi import Depends, Request
from fastapi.exceptions import RequestValidationError
from fastapi.routing import APIRoute
from fastapi.templating import Jinja2Templates
from itsdangerous import BadSignature, URLSafeTimedSerializer
from jinja2 import Environment, FileSystemLoader, select_autoescape
from markupsafe import Markup, escape
from starlette.concurrency import run_in_threadpool
from starlette.datastructures import FormData
from starlette.responses import RedirectResponse, Response

from floom.api.auth import get_ctx
from floom.cut import cut
from floom.errors import FloomError, InvalidRequest, Unauthorized
from floom.hints import Hint, Told
from floom.hints import surface as hint_surface
from floom.invisible import UNSHOWN, escapes
from floom.schemas.admin import KeyPublic
from floom.services.access import sessions as web_sessions
from floom.services.access.sessions import SignedIn
from floom.services.context import Context
from floom.services.runs.approvals import MAX_COMMENT_CHARS
from floom.ui import features as ui_features

WEB_DIR = Path(__file__).resolve().parent.parent.parent / "web"
SESSION_COOKIE = "floom_session"
LOGIN_COOKIE = "floom_login"
SESSION_MAX_AGE = int(web_sessions.SESSION_LIFETIME.total_seconds())

# Everything the pages load comes from this server; no inline script or style is allowed.
SECURITY_HEADERS = {
    "Content-Security-Policy": "default-src 'self'; img-src 'self' data:; style-src 'self'; "
    "script-src 'self'; connect-src 'self'; frame-ancestors 'none'; base-uri 'none'; "
    "form-action 'self'",
    "X-Content-Type-Options": "nosniff",
    "X-Frame-Options": "DENY",
    "Referrer-Policy": "same-origin",
}

# Marks from fonts every system has (no emoji), so the badge reads without its colour too.
STATUS_MARKS = {
    "queued": "○",
    "running": "▶",
    "awaiting_approval": "◐",
    "pending": "◐",
    "succeeded": "✓",
    "approved": "✓",
    "failed": "✗",
    "rejected": "✗",
    "timed_out": "◔",
    "limit_exceeded": "!",
    "cancelled": "⊘",
    "skipped": "»",
    "run": "✓",
    "input_invalid": "✗",
    "start_failed": "✗",
    "unmatched": "»",
    # handoff jobs
    "published": "○",
    "in_progress": "▶",
    "blocked": "■",
    "completed": "✓",
}


# -- template filters ------------------------------------------------------------------------


def when(value: datetime | None) -> Markup:
    """A <time> in UTC that app.js rewrites into the viewer's timezone, keeping UTC on hover."""
    if value is None:
        return Markup('<span class="muted">—</span>')
    utc = value.astimezone(UTC)
    text = utc.strftime("%Y-%m-%d %H:%M:%S") + " UTC"
    iso = utc.strftime("%Y-%m-%dT%H:%M:%SZ")
    return Markup('<time datetime="{0}" title="{1}">{1}</time>').format(iso, text)


def duration(start: datetime | None, end: datetime | None) -> str:
    if start is None or end is None:
        return "—"
    return seconds_text((end - start).total_seconds())


def seconds_text(seconds: float) -> str:
    """A duration as people read it: 12 ms, 2.5 s, 3 min 20 s, 1 h 5 min."""
    seconds = max(seconds, 0.0)
    if seconds < 1:  # a warm run takes a few ms: "0.0 s" would say it took no time
        return f"{seconds * 1000:.0f} ms"
    if seconds < 60:
        return f"{seconds:.1f} s"
    minutes, sec = divmod(int(seconds), 60)
    if minutes < 60:
        return f"{minutes} min {sec} s"
    hours, minutes = divmod(minutes, 60)
    return f"{hours} h {minutes} min"


def badge(status: str | None) -> Markup:
    """A status readable at a glance: a colour, a mark for colour-blind eyes, and the word."""
    status = status or "unknown"
    mark = STATUS_MARKS.get(status, "•")
    return Markup(
        '<span class="badge badge-{0}"><span aria-hidden="true">{1}</span> {2}</span>'
    ).format(status, mark, status.replace("_", " "))


def pretty_json(value: Any) -> str:
    return json.dumps(value, indent=2, ensure_ascii=False, default=str)


def size(value: int | None) -> str:
    if value is None:
        return "—"
    amount = float(value)
    for unit in ("B", "KiB", "MiB", "GiB"):
        if amount < 1024 or unit == "GiB":
            return f"{int(amount)} {unit}" if unit == "B" else f"{amount:.1f} {unit}"
        amount /= 1024
    return f"{value} B"


def short(value: str | None, length: int = 18) -> str:
    if not value:
        return ""
    return cut(value, length, marker="…")


def told(text: Told | None) -> str:
    """floom's own words (an error's message and hint, a stored notice) naming the page that
    does what they say, where they name an action."""
    if isinstance(text, Hint):
        return hint_surface.render(text, surface="ui") or ""
    return hint_surface.tell(text, surface="ui") or ""


# The invisible characters that reorder, break or hide the text around them
# (floom/invisible.py): in a worker's title a bidi override showed the worker's name beside it
# reversed. Every value a page shows says them as `\u202e` (floom's own Markup is left as it
# is), as the floom command does.
_UNSHOWN = escapes(UNSHOWN)


def _shown(value: Any) -> Any:
    """Jinja's finalize: a plain string with its invisible characters in a visible form."""
    if isinstance(value, str) and not isinstance(value, Markup):
        return value.translate(_UNSHOWN)
    return value


def _environment() -> Environment:
    env = Environment(
        loader=FileSystemLoader(WEB_DIR / "templates"),
        autoescape=select_autoescape(["html"]),
        finalize=_shown,
        trim_blocks=True,
        lstrip_blocks=True,
    )
    env.filters.update(
        when=when, badge=badge, pretty_json=pretty_json, size=size, short=short, told=told
    )
    # The bounds the services refuse past, told to the browser too (a form's maxlength).
    env.globals.update(duration=duration, quote=quote, max_comment_chars=MAX_COMMENT_CHARS)
    return env


templates = Jinja2Templates(env=_environment())


# -- sessions and CSRF -----------------------------------------------------------------------


def _serializer(ctx: Context, purpose: str) -> URLSafeTimedSerializer:
    return URLSafeTimedSerializer(ctx.secret_box.derive_key("web-ui"), salt=f"floom.{purpose}")


def sign_cookie(ctx: Context, purpose: str, value: str) -> str:
    return str(_serializer(ctx, purpose).dumps(value))


def unsign_cookie(ctx: Context, purpose: str, value: str | None, max_age: int) -> str | None:
    if not value:
        return None
    try:
        return str(_serializer(ctx, purpose).loads(value, max_age=max_age))
    except BadSignature:
        return None


def set_cookie(request: Request, response: Response, name: str, value: str, max_age: int) -> None:
    response.set_cookie(
        name,
        value,
        max_age=max_age,
        httponly=True,
        samesite="lax",
        # Behind a TLS-terminating proxy the request looks like http; FLOOM_PUBLIC_URL knows.
        secure=request.url.scheme == "https"
        or get_ctx(request).settings.public_url.startswith("https://"),
        path="/",
    )


async def current_session(request: Request) -> SignedIn:
    """The signed-in browser; anything else is sent to the sign-in page by UiRoute."""
    ctx = get_ctx(request)
    token = unsign_cookie(ctx, "session", request.cookies.get(SESSION_COOKIE), SESSION_MAX_AGE)
    me = await run_in_threadpool(web_sessions.session_for, ctx, token=token)
    request.state.signed_in = me
    return me


Me = Annotated[SignedIn, Depends(current_session)]


def session_still_valid(request: Request) -> Callable[[], object]:
    """What a long answer (a log stream) calls to ask again whether the browser is still
    signed in: raises Unauthorized once its session ended or its key was revoked."""
    ctx = get_ctx(request)
    token = unsign_cookie(ctx, "session", request.cookies.get(SESSION_COOKIE), SESSION_MAX_AGE)
    return functools.partial(web_sessions.session_for, ctx, token=token)


async def checked_form(request: Request, me: SignedIn) -> FormData:
    """The posted form, once its CSRF token matches the session's."""
    form = await request.form()
    token = form.get("csrf")
    web_sessions.check_csrf(me, token=token if isinstance(token, str) else None)
    return form


def new_login_token() -> str:
    return secrets.token_urlsafe(24)


def safe_next(target: str | None) -> str:
    """Only same-site paths, so the sign-in page cannot be used to redirect elsewhere."""
    if target and target.startswith("/") and not target.startswith(("//", "/\\")):
        return target
    return "/"


# -- rendering -------------------------------------------------------------------------------


@dataclass(frozen=True)
class Viewer:
    """Who is signed in, as the pages show it: the key's public model, never its row."""

    key: KeyPublic


def render(
    request: Request, template: str, context: dict[str, Any] | None = None, status: int = 200
) -> Response:
    me: SignedIn | None = getattr(request.state, "signed_in", None)
    values: dict[str, Any] = {
        "me": Viewer(KeyPublic.of(me.key)) if me is not None else None,
        "path": request.url.path,
        "error": None,
        "notice": None,
    }
    if me is not None:
        ctx = get_ctx(request)
        values["csrf"] = me.session.csrf_token
        values["can"] = me.can
        values.update(ui_features.nav_counts(ctx, me))
    values.update(context or {})
    response = templates.TemplateResponse(request, template, values, status_code=status)
    if me is not None:
        response.headers["Cache-Control"] = "no-store"
    return response


# The list a page belongs to, by its path's first part: an error page links back to it.
BACK_TO = {
    "runs": ("/runs", "runs"),
    "workers": ("/", "workers"),
    "handoffs": ("/handoffs", "handoff jobs"),
    "approvals": ("/approvals", "approvals"),
    "keys": ("/keys", "API keys"),
    "secrets": ("/secrets", "secrets"),
}


def error_page(request: Request, exc: FloomError) -> Response:
    section = request.url.path.strip("/").split("/", 1)[0]
    back = BACK_TO.get(section)
    return render(
        request,
        "error.html",
        {"error": exc, "back_href": back[0] if back else None, "back_label": back and back[1]},
        status=exc.status,
    )


def to_login(request: Request) -> RedirectResponse:
    target = request.url.path + (f"?{request.url.query}" if request.url.query else "")
    return RedirectResponse(f"/login?next={quote(target, safe='')}", status_code=303)


def error_markup(exc: FloomError) -> Markup:
    hint = Markup(' <span class="hint">{}</span>').format(told(exc.advice)) if exc.advice else ""
    return Markup("{}{}").format(escape(told(exc.said)), hint)


class UiRoute(APIRoute):
    """Pages never answer with JSON: a missing session redirects to sign-in, and any other
    floom error becomes a page that says what went wrong and what to do."""

    def get_route_handler(self) -> Callable[[Request], Coroutine[Any, Any, Response]]:
        original = super().get_route_handler()

        async def handler(request: Request) -> Response:
            try:
                response = await original(request)
            except Unauthorized:
                response = to_login(request)
            except FloomError as exc:
                response = await run_in_threadpool(error_page, request, exc)
            except RequestValidationError as exc:
                problems = "; ".join(
                    f"{'.'.join(str(p) for p in e.get('loc', ()))}: {e.get('msg')}"
                    for e in exc.errors()
                )
                invalid = InvalidRequest(
                    f"the address is not valid: {problems}",
                    hint="follow the links on the pages instead of editing the address",
                )
                response = await run_in_threadpool(error_page, request, invalid)
            for name, value in SECURITY_HEADERS.items():
                response.headers.setdefault(name, value)
            return response

        return handler
