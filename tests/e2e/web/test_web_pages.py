"""The web UI over plain HTTP: sessions, CSRF, errors as pages, and version diffs.

These need no browser, so they run on SQLite and PostgreSQL like the REST tests.
"""

from __future__ import annotations

import dataclasses
import re
from datetime import timedelta
from pathlib import Path
from typing import Any

import httpx
import pytest
from pydantic import BaseModel

from floom.bundle import read_folder
from floom.schemas import workers as worker_models
from floom.services.access import keys
from floom.services.access.principal import SYSTEM
from floom.services.context import Context
from floom.services.handoffs import jobs as handoff_jobs
from floom.services.runs import agent as agent_runs
from floom.services.workers import diffs
from floom.services.workers import versions as workers
from floom.store.db import session_scope
from floom.store.models import Run, utcnow
from floom.ui import support as ui_support
from floom.ui.support import SESSION_COOKIE
from floom.views import workers as worker_views
from floom.vocabulary import ToolCallStatus
from tests.support.harness import EXAMPLES, LiveServer, deploy_folder, make_worker, wait_for_run
from tests.support.rigs.handoffs import agent, roles
from tests.support.web import csrf_of, signed_in_client


def test_the_session_cookie_is_signed_httponly_samesite_and_holds_no_api_key(
    server: LiveServer,
) -> None:
    client = server.client(key="", timeout=10)
    form = client.get("/login")
    done = client.post(
        "/login", data={"csrf": csrf_of(form.text), "api_key": server.admin_key, "next": "/"}
    )
    cookie = next(
        c for c in done.headers.get_list("set-cookie") if c.startswith(SESSION_COOKIE + "=")
    )
    assert "HttpOnly" in cookie
    assert "SameSite=lax" in cookie
    assert "Path=/" in cookie
    value = client.cookies[SESSION_COOKIE]
    assert server.admin_key not in value
    assert server.admin_key[4:20] not in value
    assert client.get("/").status_code == 200

    # A cookie changed by one character is not a session.
    tampered = value[:-2] + ("A" if value[-2] != "A" else "B") + value[-1]
    forged = server.client(key="", cookies={SESSION_COOKIE: tampered})
    resp = forged.get("/")
    assert resp.status_code == 303
    assert resp.headers["location"].startswith("/login")


def test_signing_out_ends_the_session_on_the_server_so_a_copied_cookie_stops_working(
    server: LiveServer,
) -> None:
    client = signed_in_client(server, server.admin_key)
    copied = client.cookies[SESSION_COOKIE]
    page = client.get("/")
    out = client.post("/logout", data={"csrf": csrf_of(page.text)})
    assert out.status_code == 303
    assert out.headers["location"] == "/login"
    replayed = server.client(key="", cookies={SESSION_COOKIE: copied})
    assert replayed.get("/").status_code == 303


def test_revoking_the_api_key_of_a_session_signs_that_browser_out(
    server: LiveServer, api: httpx.Client
) -> None:
    key, token = keys.create_key(server.ctx, caller=SYSTEM, scopes=["run"], name="laptop")
    client = signed_in_client(server, token)
    assert client.get("/runs").status_code == 200
    api.delete(f"/api/v1/keys/{key.id}")
    resp = client.get("/runs")
    assert resp.status_code == 303
    assert resp.headers["location"] == "/login?next=%2Fruns"


def test_every_form_is_refused_without_the_session_csrf_token_and_changes_nothing(
    server: LiveServer, api: httpx.Client
) -> None:
    deploy_folder(api, EXAMPLES / "hello")
    client = signed_in_client(server, server.admin_key)
    posts = {
        "/workers/hello/runs": {"name": "Mallory"},
        "/workers/hello/rollback": {"version_id": "v000000000000"},
        "/secrets": {"name": "STOLEN", "value": "value-1234"},
        "/keys": {"name": "backdoor", "scope": "admin"},
        "/logout": {},
    }
    for path, data in posts.items():
        for token in (None, "not-the-token"):
            body = dict(data, csrf=token) if token else data
            resp = client.post(path, data=body)
            assert resp.status_code == 403, path
            assert resp.headers["content-type"].startswith("text/html")
            assert "CSRF token missing or stale" in resp.text
    assert api.get("/api/v1/runs").json()["items"] == []
    assert api.get("/api/v1/secrets").json()["items"] == []
    assert [k["name"] for k in api.get("/api/v1/keys").json()["items"]] == ["test admin"]
    assert client.get("/").status_code == 200  # still signed in: /logout was refused too


def test_the_sign_in_form_needs_its_own_token_and_only_returns_to_this_site(
    server: LiveServer,
) -> None:
    bare = server.client(key="", timeout=10)
    refused = bare.post("/login", data={"api_key": server.admin_key, "csrf": "guess"})
    assert refused.status_code == 403
    assert SESSION_COOKIE not in refused.cookies
    assert "sign-in form expired" in refused.text

    client = server.client(key="", timeout=10)
    form = client.get("/login", params={"next": "//elsewhere.example/x"})
    done = client.post(
        "/login",
        data={
            "csrf": csrf_of(form.text),
            "api_key": server.admin_key,
            "next": "//elsewhere.example/x",
        },
    )
    assert done.status_code == 303
    assert done.headers["location"] == "/"


def test_errors_are_pages_with_the_message_and_the_hint_not_json(
    server: LiveServer, api: httpx.Client
) -> None:
    deploy_folder(api, EXAMPLES / "hello")
    client = signed_in_client(server, server.admin_key)
    missing = client.get("/runs/run_nope")
    assert missing.status_code == 404
    assert missing.headers["content-type"].startswith("text/html")
    assert "no run run_nope" in missing.text
    assert "the Runs page (/runs)" in missing.text
    bad_filter = client.get("/runs", params={"status": "exploded"})
    assert bad_filter.status_code == 400
    assert "unknown status" in bad_filter.text
    no_worker = client.get("/workers/nope")
    assert no_worker.status_code == 404
    assert "known workers: hello" in no_worker.text
    # Pages carry headers that keep other sites from framing them or injecting script.
    page = client.get("/")
    assert "frame-ancestors 'none'" in page.headers["content-security-policy"]
    assert page.headers["cache-control"] == "no-store"


def test_a_version_diff_covers_the_manifest_and_every_added_removed_or_changed_file(
    ctx: Context, tmp_path: Path
) -> None:
    folder = make_worker(
        tmp_path / "dif",
        "name: dif\ndescription: one\n",
        {"run.py": "print('a')\n", "old.txt": "gone soon\n", "blob.bin": "x"},
    )
    (folder / "blob.bin").write_bytes(b"\0\1\2")
    v1 = workers.deploy(
        ctx, caller=SYSTEM, archive=read_folder(folder, max_bytes=10**7).to_archive()
    ).version
    (folder / "worker.yml").write_text("name: dif\ndescription: two\n")
    (folder / "old.txt").unlink()
    (folder / "new.txt").write_text("hello\n")
    (folder / "blob.bin").write_bytes(b"\0\1\3\4")
    v2 = workers.deploy(
        ctx, caller=SYSTEM, archive=read_folder(folder, max_bytes=10**7).to_archive()
    ).version

    result = diffs.diff_versions(ctx, caller=SYSTEM, worker_name="dif", old_id=v1.id, new_id=v2.id)
    by_path = {f.path: f for f in result.files}
    assert result.files[0].path == "worker.yml"
    assert {p: f.status for p, f in by_path.items()} == {
        "worker.yml": "changed",
        "blob.bin": "changed",
        "new.txt": "added",
        "old.txt": "removed",
        "run.py": "unchanged",
    }
    assert "-description: one" in by_path["worker.yml"].lines
    assert "+description: two" in by_path["worker.yml"].lines
    assert by_path["new.txt"].lines[-1] == "+hello"
    assert by_path["blob.bin"].text is False
    assert by_path["blob.bin"].new_size == 4
    assert [f.path for f in result.changed] == ["worker.yml", "blob.bin", "new.txt", "old.txt"]


def test_the_diff_page_is_given_the_versions_public_models(ctx: Context, tmp_path: Path) -> None:
    folder = make_worker(tmp_path / "pub", "name: pub\n", {"run.py": "print(1)\n"})
    v1 = workers.deploy(
        ctx, caller=SYSTEM, archive=read_folder(folder, max_bytes=10**7).to_archive()
    ).version
    (folder / "run.py").write_text("print(2)\n")
    v2 = workers.deploy(
        ctx, caller=SYSTEM, archive=read_folder(folder, max_bytes=10**7).to_archive()
    ).version

    diff = worker_views.version_diff(ctx, name="pub", old_id=v1.id, new_id=v2.id, caller=SYSTEM)
    assert isinstance(diff.old, worker_models.VersionPublic)
    assert (diff.old.id, diff.old.active, diff.new.id, diff.new.active) == (
        v1.id,
        False,
        v2.id,
        True,
    )
    assert [(f.path, f.status) for f in diff.changed] == [("run.py", "changed")]
    assert diff.to_json()["files"][1]["lines"] == ["@@ -1 +1 @@", "-print(1)", "+print(2)"]


def _rows_in(value: Any, where: str, depth: int = 0) -> list[str]:
    """Where a database row sits in a template's values (table models have a __table__)."""
    if hasattr(type(value), "__table__"):
        return [f"{where}: {type(value).__name__}"]
    if depth > 8:
        return []
    found: list[str] = []
    if isinstance(value, BaseModel):
        for name in type(value).model_fields:
            found += _rows_in(getattr(value, name), f"{where}.{name}", depth + 1)
    elif dataclasses.is_dataclass(value) and not isinstance(value, type):
        for f in dataclasses.fields(value):
            found += _rows_in(getattr(value, f.name), f"{where}.{f.name}", depth + 1)
    elif isinstance(value, dict):
        for key, item in value.items():
            found += _rows_in(item, f"{where}[{key!r}]", depth + 1)
    elif isinstance(value, list | tuple | set | frozenset):
        for i, item in enumerate(value):
            found += _rows_in(item, f"{where}[{i}]", depth + 1)
    return found


def test_pages_are_given_public_models_never_database_rows(
    server: LiveServer, api: httpx.Client, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    rows: dict[str, list[str]] = {}
    render = ui_support.templates.TemplateResponse

    def recording(request: Any, name: str, context: dict[str, Any], **options: Any) -> Any:
        rows[name] = _rows_in(context, name)
        return render(request, name, context, **options)

    monkeypatch.setattr(ui_support.templates, "TemplateResponse", recording)
    script = (
        'import os\nopen(os.environ["FLOOM_OUTPUT_DIR"] + "/report.csv", "w").write("a\\n1\\n")\n'
    )
    folder = make_worker(tmp_path / "rows", "name: rows\n", {"run.py": script})
    deploy_folder(api, folder)
    (folder / "worker.yml").write_text("name: rows\ndescription: again\n")
    deploy_folder(api, folder)
    run_id = api.post("/api/v1/workers/rows/runs", json={}).json()["id"]
    assert wait_for_run(api, run_id)["status"] == "succeeded"
    api.put("/api/v1/secrets/TOKEN", json={"value": "value-1234"})
    roles(server.ctx, "coder")
    coder = agent(server.ctx, "alice", "coder")
    job = handoff_jobs.create_job(server.ctx, actor=coder, summary="fix it", role="coder")
    client = signed_in_client(server, server.admin_key)
    pages = [
        "/",
        "/workers/rows",
        "/workers/rows/diff",
        "/runs",
        f"/runs/{run_id}",
        f"/runs/{run_id}/artifacts/report.csv",
        "/approvals",
        "/secrets",
        "/keys",
        "/nodes",
        "/handoffs",
        f"/handoffs/jobs/{job.row.id}",
        "/runs/run_nope",
    ]
    for page in pages:
        assert client.get(page).status_code in (200, 404), page
    form = {"csrf": csrf_of(client.get("/keys").text), "name": "k", "scope": "read"}
    created = client.post("/keys", data=form)
    assert created.status_code == 200
    assert "shown only this once" in created.text

    assert {
        "workers.html",
        "worker.html",
        "diff.html",
        "runs.html",
        "run.html",
        "artifact.html",
        "approvals.html",
        "secrets.html",
        "keys.html",
        "nodes.html",
        "handoffs.html",
        "handoff_job.html",
        "error.html",
    } <= set(rows)
    assert {name: found for name, found in rows.items() if found} == {}


def _run_ids(html: str) -> list[str]:
    return list(dict.fromkeys(re.findall(r'<a href="/runs/(run_[0-9a-f]+)"', html)))


def test_the_runs_list_filters_by_worker_status_trigger_and_time_and_pages_by_cursor(
    server: LiveServer, api: httpx.Client
) -> None:
    deploy_folder(api, EXAMPLES / "hello")
    ids = [
        wait_for_run(api, api.post("/api/v1/workers/hello/runs", json={}).json()["id"])["id"]
        for _ in range(3)
    ]
    with session_scope(server.ctx.engine, write=True) as s:
        oldest = s.get(Run, ids[0])
        assert oldest is not None
        oldest.created_at = utcnow() - timedelta(days=2)
        s.add(oldest)
    client = signed_in_client(server, server.admin_key)

    first = client.get("/runs", params={"worker": "hello", "limit": 2})
    assert _run_ids(first.text) == [ids[2], ids[1]]
    older = re.search(r'href="(/runs\?[^"]*cursor=[^"]+)" rel="next"', first.text)
    assert older, "no link to the older runs"
    second = client.get(older.group(1).replace("&amp;", "&"))
    assert _run_ids(second.text) == [ids[0]]
    assert 'rel="next"' not in second.text

    assert _run_ids(client.get("/runs", params={"since": "24h"}).text) == [ids[2], ids[1]]
    assert _run_ids(client.get("/runs", params={"status": "succeeded"}).text) == ids[::-1]
    nothing = client.get("/runs", params={"status": "failed", "trigger": "api"})
    assert _run_ids(nothing.text) == []
    assert "No runs match these filters" in nothing.text


def test_a_run_page_shows_its_tool_calls_in_order_with_arguments_and_results(
    server: LiveServer, api: httpx.Client
) -> None:
    deploy_folder(api, EXAMPLES / "hello")
    run = wait_for_run(api, api.post("/api/v1/workers/hello/runs", json={}).json()["id"])
    for tool, args, result in (
        ("web_fetch", {"url": "http://127.0.0.1/a"}, "<p>page</p>"),
        ("remember", {"key": "seen", "value": 3}, "ok"),
    ):
        agent_runs.record_tool_call(
            server.ctx,
            run_id=run["id"],
            attempt=1,
            tool=tool,
            arguments=args,
            status=ToolCallStatus.OK,
            result=result,
            duration_ms=12,
        )
    client = signed_in_client(server, server.admin_key)
    page = client.get(f"/runs/{run['id']}").text
    timeline = page[page.index('id="tool-calls"') : page.index('id="approvals"')]
    assert timeline.index("web_fetch") < timeline.index("remember")
    assert "http://127.0.0.1/a" in timeline
    assert "&lt;p&gt;page&lt;/p&gt;" in timeline


def test_a_read_key_is_refused_a_rollback_from_a_run_page_and_nothing_changes(
    server: LiveServer, api: httpx.Client, tmp_path: Path
) -> None:
    first = deploy_folder(
        api, make_worker(tmp_path / "v1", "name: roll\n", {"run.py": "print(1)\n"})
    )
    run = wait_for_run(api, api.post("/api/v1/workers/roll/runs", json={}).json()["id"])
    second = deploy_folder(
        api, make_worker(tmp_path / "v2", "name: roll\n", {"run.py": "print(2)\n"})
    )
    _, read_key = keys.create_key(server.ctx, caller=SYSTEM, scopes=["read"], name="looker")
    client = signed_in_client(server, read_key)
    page = client.get(f"/runs/{run['id']}")
    assert page.status_code == 200
    assert "Roll back" not in page.text

    refused = client.post(f"/runs/{run['id']}/rollback", data={"csrf": csrf_of(page.text)})
    assert refused.status_code == 403
    assert "lacks the &#39;deploy&#39; scope" in refused.text
    active = api.get("/api/v1/workers/roll").json()["active_version_id"]
    assert active == second["version"]["id"] != first["version"]["id"]


# The first of these reaches no API route, so it loads the web UI (floom/api/ui_mount.py).
ASKED = [
    ("GET", "/api/v1/no-such-thing"),
    ("POST", "/healthz"),
    ("GET", "/no/such/page"),
    ("GET", "/login"),
    ("GET", "/api/v1/runs/"),
]


def test_the_ui_loaded_by_a_first_request_changes_no_answer_from_that_one_on(
    server: LiveServer,
) -> None:
    client = server.client(key="", timeout=10)
    first = [client.request(method, path) for method, path in ASKED]
    again = [client.request(method, path) for method, path in ASKED]
    assert [(r.status_code, r.text) for r in first] == [(r.status_code, r.text) for r in again]
    assert [r.status_code for r in first] == [404, 405, 404, 200, 307]
    assert first[0].json()["error"]["code"] == "not_found"
    assert 'name="api_key"' in first[3].text


# The forms a signed-in browser may post whatever its key's scope: signing in and out.
UI_POSTS_OF_ANY_SCOPE = {"/login", "/logout"}
# A value for each path parameter of a UI form, so every form is walked; the scope is
# decided before any of them is looked at.
UI_PATH_VALUES = {
    "name": "hello",
    "key_id": "key_0",
    "approval_id": "apr_0",
    "job_id": "job_0",
    "delivery_id": "adl_0",
    "action": "enable",
}


def _ui_posts(server: LiveServer) -> list[str]:
    from fastapi import FastAPI
    from fastapi.routing import APIRoute

    from floom.ui import app as ui_app

    app = FastAPI()
    app.state.ctx = server.ctx
    ui_app.install(app)
    found = sorted(
        route.path
        for route in app.routes
        if isinstance(route, APIRoute) and "POST" in (route.methods or ())
    )
    assert len(found) > 20, found
    return found


def test_every_ui_form_refuses_a_read_key_s_session_and_changes_nothing(
    server: LiveServer, api: httpx.Client
) -> None:
    """Walked from the UI's own routes, so a new form is covered: a browser signed in with
    a read key is refused (403) by every form but signing in and out, before the form's
    fields or the object it names are looked at; nothing is written. The services decide
    (caller.require), the forms only translate: a form that acted for its session without
    asking would show here."""
    deploy_folder(api, EXAMPLES / "hello")
    run = api.post("/api/v1/workers/hello/runs", json={}).json()
    wait_for_run(api, run["id"])
    _, token = keys.create_key(server.ctx, caller=SYSTEM, scopes=["read"], name="reader")
    browser = signed_in_client(server, token)
    csrf = csrf_of(browser.get("/").text)
    fields = {"csrf": csrf, "name": "STOLEN", "value": "value-1234", "scope": "admin"}
    wrong = []
    for path in _ui_posts(server):
        if path in UI_POSTS_OF_ANY_SCOPE:
            continue
        url = re.sub(r"\{(\w+)\}", lambda m: UI_PATH_VALUES.get(m[1], run["id"]), path)
        resp = browser.post(url, data=fields)
        if resp.status_code != 403:
            wrong.append(f"POST {path}: {resp.status_code}")
    assert wrong == [], "\n".join(wrong)
    assert [r["id"] for r in api.get("/api/v1/runs").json()["items"]] == [run["id"]]
    assert api.get("/api/v1/secrets").json()["items"] == []
    assert len(api.get("/api/v1/keys").json()["items"]) == 2
    assert api.get("/api/v1/workers/hello").json()["paused"] is False
