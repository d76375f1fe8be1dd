"""The web UI in a real headless Chromium against a live floom server on loopback.

SQLite only: the pages call the same services the REST tests cover on both databases.
Screenshots of the main pages are saved to test-artifacts/screenshots/.
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import httpx
import pytest

from floom.services.access import keys
from floom.services.access.principal import SYSTEM
from floom.services.runs.approvals import MAX_COMMENT_CHARS
from tests.support import web as web_support
from tests.support.harness import (
    EXAMPLES,
    LiveServer,
    deploy_folder,
    make_worker,
    wait_for_run,
    wait_until,
)
from tests.support.web import (
    GATED_PY,
    GATED_YML,
    SLOW_PY,
    SLOW_YML,
    Tab,
    run_id_of,
)

pytest.importorskip("playwright.sync_api")


# The browser fixtures, shared with the other browser test module.
database_url = web_support.sqlite_database_url
browser = web_support.browser
tab = web_support.tab


def test_a_signed_out_visitor_is_sent_to_sign_in_and_sees_no_data(
    tab: Tab, api: httpx.Client
) -> None:
    deploy_folder(api, EXAMPLES / "hello")
    run = wait_for_run(api, api.post("/api/v1/workers/hello/runs", json={}).json()["id"])
    run_path = f"/runs/{run['id']}"
    for path in ("/", "/runs", "/workers/hello", run_path, "/approvals", "/secrets", "/keys"):
        tab.goto(path)
        assert tab.page.url.startswith(tab.url("/login?next="))
        body = tab.page.content()
        assert "Greets someone" not in body
        assert "Hello, world" not in body
        assert tab.page.get_by_role("heading", name="Sign in to floom").is_visible()
    tab.shot("login")

    # Nothing answers without a session: not the log stream, not an artifact, not a form.
    anonymous = tab.server.client(key="", follow_redirects=False, timeout=10)
    for path in (f"{run_path}/logs/stream", f"{run_path}/files/greeting.txt"):
        resp = anonymous.get(path)
        assert resp.status_code == 303
        assert resp.headers["location"].startswith("/login")
    posted = anonymous.post(f"{run_path}/replay", data={"csrf": "x"})
    assert posted.status_code == 303
    assert len(api.get("/api/v1/runs").json()["items"]) == 1
    # A bearer key is for the API; the pages ignore it.
    bearer = anonymous.get("/", headers={"Authorization": f"Bearer {tab.server.admin_key}"})
    assert bearer.status_code == 303

    # A wrong key is refused in the page, not as JSON, and signs nobody in.
    tab.goto("/login")
    tab.page.get_by_label("API key").fill("flm_not-a-key")
    tab.page.get_by_role("button", name="Sign in").click()
    assert tab.page.get_by_role("alert").inner_text().startswith("the API key is not valid")
    assert "{" not in tab.page.get_by_role("alert").inner_text()
    tab.goto("/")
    assert tab.page.url.startswith(tab.url("/login"))


def test_a_read_key_signs_in_sees_everything_but_cannot_run_and_signs_out(
    tab: Tab, api: httpx.Client, server: LiveServer
) -> None:
    deploy_folder(api, EXAMPLES / "hello")
    _, read_key = keys.create_key(server.ctx, caller=SYSTEM, scopes=["read"], name="viewer")
    tab.goto("/runs?worker=hello")
    tab.page.get_by_label("API key").fill(read_key)
    tab.page.get_by_role("button", name="Sign in").click()
    # Back where the visitor was going, with an empty state that says what to do.
    tab.page.wait_for_url(tab.url("/runs?worker=hello"))
    assert "No runs match these filters" in tab.page.inner_text("main")

    # Keyboard only: a skip link first, then the navigation, each with a visible focus ring.
    focused = "() => document.activeElement.textContent.trim()"
    ring = "() => getComputedStyle(document.activeElement).outlineStyle"
    tab.page.keyboard.press("Tab")
    assert tab.page.evaluate(focused) == "Skip to content"
    for _ in range(2):
        tab.page.keyboard.press("Tab")
    assert tab.page.evaluate(focused) == "Workers"
    assert tab.page.evaluate(ring) != "none"
    tab.page.keyboard.press("Enter")
    tab.page.wait_for_url(tab.url("/"))
    tab.page.get_by_role("link", name="Hello").click()
    tab.page.wait_for_url(tab.url("/workers/hello"))
    assert "you can look, not run" in tab.page.inner_text("#run")
    assert tab.page.locator("#run-form").count() == 0
    nav = tab.page.get_by_role("navigation", name="Main")
    assert nav.get_by_role("link", name="Secrets").count() == 0
    # Posting anyway (with a valid CSRF token) is refused in the page, and nothing runs.
    csrf = tab.page.locator("input[name=csrf]").first.get_attribute("value")
    refused = tab.page.request.post(
        tab.url("/workers/hello/runs"), form={"csrf": csrf or "", "name": "Eve"}
    )
    assert refused.status == 403
    assert "lacks the &#39;run&#39; scope" in refused.text()
    assert api.get("/api/v1/runs").json()["items"] == []
    session = next(c for c in tab.context.cookies() if c["name"] == "floom_session")
    assert session["httpOnly"]
    assert session["sameSite"] == "Lax"
    assert read_key not in session["value"]

    tab.page.get_by_role("button", name="Sign out").click()
    tab.page.wait_for_url(re.compile(r".*/login$"))
    tab.goto("/workers/hello")
    assert tab.page.url.startswith(tab.url("/login"))


def test_a_worker_runs_from_its_generated_form_and_its_log_streams_in_live(
    tab: Tab, api: httpx.Client, tmp_path: Path
) -> None:
    deploy_folder(api, make_worker(tmp_path / "ticker", SLOW_YML, {"run.py": SLOW_PY}))
    tab.sign_in()
    tab.shot("workers")
    tab.page.get_by_role("link", name="Ticker").click()
    form = tab.page.locator("#run-form")
    # The form follows the declared inputs: types, required, defaults, enums.
    assert form.get_by_label("label").get_attribute("required") is not None
    assert form.get_by_label("ticks").get_attribute("type") == "number"
    assert form.get_by_label("ticks").input_value() == "8"
    assert form.get_by_label("pace").evaluate("e => [...e.options].map(o => o.value)") == [
        "slow",
        "fast",
    ]
    assert form.get_by_label("shout").get_attribute("type") == "checkbox"
    assert form.get_by_label("extra").evaluate("e => e.tagName") == "TEXTAREA"

    # A bad value comes back in place, next to its field, with what was typed kept.
    form.get_by_label("label").fill("go")
    form.get_by_label("extra").fill("[1, 2]")
    form.get_by_role("button", name="Run ticker").click()
    assert "expected object" in tab.page.locator(".field-problem").inner_text()
    assert tab.page.locator("#run-form").get_by_label("label").input_value() == "go"
    assert api.get("/api/v1/runs").json()["items"] == []
    tab.shot("worker")

    form = tab.page.locator("#run-form")
    form.get_by_label("extra").fill('{"note": "from the browser"}')
    form.get_by_label("shout").check()
    form.get_by_role("button", name="Run ticker").click()
    tab.page.wait_for_url(re.compile(r".*/runs/run_[0-9a-f]+$"))
    run_id = run_id_of(tab.page.url)
    tab.page.evaluate("window.__sameDocument = true")
    shown_at_load = tab.page.locator("#log li[data-seq]").count()

    tab.page.locator("#log li", has_text="GO tick 3").wait_for()
    assert api.get(f"/api/v1/runs/{run_id}").json()["status"] == "running"
    tab.page.locator("#run-head .badge-succeeded").wait_for()
    assert tab.page.evaluate("window.__sameDocument") is True  # streamed, not reloaded
    lines = tab.page.locator("#log li[data-seq]")
    assert lines.count() > shown_at_load
    seqs = [int(s) for s in lines.evaluate_all("els => els.map(e => e.dataset.seq)")]
    assert seqs == list(range(seqs[0], seqs[0] + len(seqs)))
    ticks = [t for t in lines.all_inner_texts() if " tick " in t]
    assert [t.rsplit("tick ", 1)[1] for t in ticks] == [str(i) for i in range(1, 9)]
    # Times show in the viewer's timezone, with UTC on hover.
    created = tab.page.locator("#run-summary time").first
    assert "UTC" in (created.get_attribute("title") or "")
    assert "UTC" not in created.inner_text()
    assert "EST" in created.inner_text()

    run = api.get(f"/api/v1/runs/{run_id}").json()
    assert run["inputs"]["extra"] == {"note": "from the browser"}
    assert run["inputs"]["shout"]
    assert "done" in tab.page.inner_text("#outputs")
    tab.shot("run")


def test_artifacts_open_with_previews_and_download(
    tab: Tab, api: httpx.Client, tmp_path: Path
) -> None:
    deploy_folder(api, make_worker(tmp_path / "ticker", SLOW_YML, {"run.py": SLOW_PY}))
    inputs = {"label": "a<b>", "ticks": 3, "pace": "fast", "extra": {"k": 1}}
    run = wait_for_run(
        api, api.post("/api/v1/workers/ticker/runs", json={"inputs": inputs}).json()["id"]
    )
    assert run["status"] == "succeeded", run
    tab.sign_in()
    tab.goto(f"/runs/{run['id']}")

    tab.page.get_by_role("link", name="report.csv").click()
    table = tab.page.locator("table.data")
    assert table.locator("th").all_inner_texts() == ["tick", "label"]
    assert table.locator("tbody tr").count() == 3
    assert table.locator("tbody tr").first.locator("td").all_inner_texts() == ["1", "a<b>"]
    tab.shot("artifact")
    download = tab.page.request.get(tab.url(f"/runs/{run['id']}/files/report.csv"))
    assert download.status == 200
    assert download.body().startswith(b"tick,label\n1,a<b>")
    assert download.headers["content-disposition"].startswith("attachment")

    tab.goto(f"/runs/{run['id']}")
    tab.page.get_by_role("link", name="summary.json").click()
    assert json.loads(tab.page.locator("pre.preview-text").inner_text()) == {
        "label": "a<b>",
        "extra": {"k": 1},
    }

    tab.goto(f"/runs/{run['id']}")
    tab.page.get_by_role("link", name="pixel.png").click()
    # Binary artifacts are never shown inline (secrets are redacted only in text).
    assert tab.page.get_by_role("img", name="pixel.png").count() == 0
    assert "binary files are not previewed" in tab.page.inner_text("main")
    picture = tab.page.request.get(tab.url(f"/runs/{run['id']}/files/pixel.png?inline=true"))
    assert picture.headers["content-disposition"].startswith("attachment")


def test_a_waiting_approval_is_approved_with_edits_from_the_inbox(
    tab: Tab, api: httpx.Client, tmp_path: Path
) -> None:
    deploy_folder(api, make_worker(tmp_path / "publisher", GATED_YML, {"run.py": GATED_PY}))
    tab.sign_in()
    tab.goto("/approvals")
    assert "Nothing is waiting for you" in tab.page.inner_text("main")

    run_id = api.post("/api/v1/workers/publisher/runs", json={}).json()["id"]
    wait_until(lambda: api.get(f"/api/v1/runs/{run_id}").json()["status"] == "awaiting_approval")
    tab.goto("/approvals")
    nav = tab.page.get_by_role("navigation", name="Main")
    assert nav.get_by_role("link", name=re.compile("Approvals")).inner_text() == "Approvals 1"
    card = tab.page.locator("article.approval")
    assert "Draft title" in card.inner_text()
    tab.shot("approvals")

    # Edits that are not JSON come back in place, and nothing is decided.
    card.get_by_text("Approve with edits").click()
    edit_box = card.get_by_label("Values to use")
    edit_box.fill('{"title": "Final title"')
    card.get_by_role("button", name="Approve with these values").click()
    assert "not valid JSON" in tab.page.get_by_role("alert").first.inner_text()
    assert api.get(f"/api/v1/runs/{run_id}").json()["status"] == "awaiting_approval"

    card = tab.page.locator("article.approval")
    card.get_by_text("Approve with edits").click()
    card.get_by_label("Values to use").fill('{"title": "Final title"}')
    card.get_by_role("button", name="Approve with these values").click()
    tab.page.wait_for_url(re.compile(r".*/approvals\?notice=approved$"))
    assert "Nothing is waiting for you" in tab.page.inner_text("main")

    run = wait_for_run(api, run_id)
    assert run["status"] == "succeeded"
    assert run["outputs"] == {"title": "Final title"}
    tab.goto(f"/runs/{run_id}")
    approvals_section = tab.page.locator("#approvals")
    assert "Approved" in approvals_section.inner_text()
    assert "Final title" in approvals_section.inner_text()

    # A rejection from the run's own page needs a reason and ends the run with it.
    second = api.post("/api/v1/workers/publisher/runs", json={}).json()["id"]
    wait_until(lambda: api.get(f"/api/v1/runs/{second}").json()["status"] == "awaiting_approval")
    tab.goto(f"/runs/{second}")
    card = tab.page.locator("#approvals article.approval")
    card.locator("summary", has_text="Reject").click()
    # The browser stops a comment where the API would refuse it (it did not: no maxlength).
    for field in (card.get_by_label("Why"), card.get_by_label("Comment (optional)")):
        assert field.get_attribute("maxlength") == str(MAX_COMMENT_CHARS)
    card.get_by_label("Why").fill("not this one")
    card.get_by_role("button", name="Reject with this reason").click()
    tab.page.wait_for_url(tab.url(f"/runs/{second}?notice=rejected"))
    assert "Rejected" in tab.page.inner_text("#approvals")
    rejected = api.get(f"/api/v1/runs/{second}").json()
    assert rejected["status"] == "rejected"
    assert "not this one" in rejected["error"]["message"]


def test_replay_from_the_run_page_runs_again_with_the_same_inputs(
    tab: Tab, api: httpx.Client
) -> None:
    deploy_folder(api, EXAMPLES / "hello")
    first = wait_for_run(
        api, api.post("/api/v1/workers/hello/runs", json={"inputs": {"name": "Ada"}}).json()["id"]
    )
    tab.sign_in()
    tab.goto(f"/runs/{first['id']}")
    tab.page.get_by_role("button", name="Replay", exact=True).click()
    tab.page.wait_for_url(lambda url: "/runs/run_" in url and first["id"] not in url)
    replay_id = run_id_of(tab.page.url)
    assert "Replay of" in tab.page.inner_text("#run-lineage")
    tab.page.locator("#run-head .badge-succeeded").wait_for()

    replay = api.get(f"/api/v1/runs/{replay_id}").json()
    assert replay["replay_of"] == first["id"]
    assert replay["inputs"] == first["inputs"]
    assert replay["version_id"] == first["version_id"]
    tab.goto(f"/runs/{first['id']}")
    assert replay_id in tab.page.inner_text("#run-lineage")

    tab.goto("/runs?trigger=replay")
    rows = tab.page.locator("table tbody tr")
    assert rows.count() == 1
    assert replay_id in rows.inner_text()
    tab.goto("/runs")
    tab.shot("runs")


def test_a_version_diff_shows_the_change_and_rollback_activates_the_earlier_version(
    tab: Tab, api: httpx.Client, tmp_path: Path
) -> None:
    folder = make_worker(
        tmp_path / "ver", "name: ver\ndescription: first\n", {"run.py": "print('one')\n"}
    )
    v1 = deploy_folder(api, folder)["version"]["id"]
    (folder / "run.py").write_text("print('two')\n")
    (folder / "notes.txt").write_text("added later\n")
    v2 = deploy_folder(api, folder)["version"]["id"]
    tab.sign_in()
    tab.goto("/workers/ver")
    tab.page.get_by_role("button", name="Show diff").click()
    tab.page.wait_for_url(re.compile(r".*/workers/ver/diff\?old=.*"))
    assert tab.page.locator("pre.diff .del", has_text="print('one')").count() == 1
    assert tab.page.locator("pre.diff .add", has_text="print('two')").count() == 1
    assert "notes.txt added" in tab.page.inner_text("main")
    tab.shot("diff")

    tab.goto("/workers/ver")
    tab.page.get_by_role("button", name=f"Roll back to {v1}").click()
    tab.page.wait_for_url(re.compile(r".*/workers/ver\?notice=rolled-back.*"))
    assert "Rolled back" in tab.page.get_by_role("status").inner_text()
    assert api.get("/api/v1/workers/ver").json()["active_version_id"] == v1
    assert tab.page.get_by_role("button", name=f"Roll back to {v2}").is_visible()


def test_secrets_and_api_keys_are_managed_in_the_browser_without_showing_values(
    tab: Tab, api: httpx.Client
) -> None:
    tab.sign_in()
    tab.goto("/secrets")
    assert "No secrets yet" in tab.page.inner_text("main")
    tab.page.get_by_label("Name").fill("API_TOKEN")
    tab.page.get_by_label("Value").fill("abc")
    tab.page.locator("form[action='/secrets'] input[type=password]").evaluate(
        "e => e.removeAttribute('minlength')"
    )
    tab.page.get_by_role("button", name="Save secret").click()
    assert "shorter than 4 characters" in tab.page.get_by_role("alert").inner_text()
    tab.page.get_by_label("Value").fill("s3cret-value-42")
    tab.page.get_by_role("button", name="Save secret").click()
    tab.page.wait_for_url(re.compile(r".*/secrets\?notice=secret-set$"))
    assert "API_TOKEN" in tab.page.inner_text("table")
    assert "s3cret-value-42" not in tab.page.content()
    tab.shot("secrets")
    tab.page.get_by_role("button", name="Delete API_TOKEN").click()
    tab.page.wait_for_url(re.compile(r".*notice=secret-deleted$"))
    assert api.get("/api/v1/secrets").json()["items"] == []

    tab.goto("/keys")
    tab.page.get_by_label("Name").fill("ci")
    tab.page.get_by_label("Scope").select_option("run")
    tab.page.get_by_role("button", name="Create key").click()
    token = tab.page.get_by_label(re.compile(r"API key \(run\)")).input_value()
    assert token.startswith("flm_")
    assert httpx.get(
        tab.url("/api/v1/runs"), headers={"Authorization": f"Bearer {token}"}
    ).is_success
    tab.shot("keys")
    tab.goto("/keys")
    assert token not in tab.page.content()  # shown once
    row = tab.page.locator("tr", has_text="ci")
    row.get_by_role("button", name="Revoke").click()
    tab.page.wait_for_url(re.compile(r".*notice=key-revoked$"))
    revoked = httpx.get(tab.url("/api/v1/runs"), headers={"Authorization": f"Bearer {token}"})
    assert revoked.status_code == 401


def test_core_pages_work_without_javascript_on_a_phone(
    browser: Any, server: LiveServer, api: httpx.Client
) -> None:
    deploy_folder(api, EXAMPLES / "hello")
    phone = Tab(browser, server, viewport={"width": 390, "height": 844}, java_script_enabled=False)
    try:
        phone.sign_in()
        phone.page.get_by_role("link", name="Hello").click()
        phone.page.get_by_label("name").fill("Phone")
        phone.page.get_by_role("button", name="Run hello").click()
        phone.page.wait_for_url(re.compile(r".*/runs/run_[0-9a-f]+$"))
        run_id = run_id_of(phone.page.url)
        wait_for_run(api, run_id)
        phone.page.reload()
        assert "Hello, Phone!" in phone.page.inner_text("#log")
        # Without script the times stay in UTC, and say so.
        assert phone.page.locator("#run-summary time").first.inner_text().endswith("UTC")
        no_sideways_scroll = "document.documentElement.scrollWidth <= window.innerWidth"
        assert phone.page.evaluate(no_sideways_scroll)
        phone.shot("run-phone")
        phone.page.get_by_role("navigation", name="Main").get_by_role("link", name="Runs").click()
        # The page the link loads, not the one it leaves (mid-navigation there is no document).
        phone.page.wait_for_url(phone.url("/runs"))
        assert phone.page.evaluate(no_sideways_scroll)
        phone.shot("runs-phone")
        assert phone.problems == []
    finally:
        phone.close()
