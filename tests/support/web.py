"""Shared pieces of the web UI tests: the browser launch, a Tab that records page problems,
and the workers the tests deploy."""

from __future__ import annotations

import os
import re
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.support.harness import REPO, LiveServer

CHROMIUM = "/usr/bin/chromium"
CHROMIUM_ARGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--no-first-run",
]
WAIT_MS = 15_000
SHOTS = REPO / "test-artifacts" / "screenshots"

PIXEL_PNG = (
    "iVBORw0KGgoAAAANSUhEUgAAAAQAAAADCAIAAAA7ljmRAAAAEElEQVR4nGM4oaEBRww4OQAHpg0hlLAT/AAAAABJ"
    "RU5ErkJggg=="
)

SLOW_YML = """\
name: ticker
title: Ticker
description: Prints numbered ticks slowly and saves what it did.
inputs:
  label: {type: string, required: true, description: Printed before each tick.}
  ticks: {type: integer, default: 8}
  pace: {type: string, enum: [slow, fast], default: slow}
  shout: {type: boolean, default: false}
  extra: {type: object, description: "Anything else, as JSON."}
outputs:
  done: {type: integer, required: true}
"""
SLOW_PY = f"""\
import base64, json, os, time
inputs = json.load(open("inputs.json"))
label = inputs["label"].upper() if inputs["shout"] else inputs["label"]
gap = 0.3 if inputs["pace"] == "slow" else 0.01
for i in range(1, inputs["ticks"] + 1):
    print(f"{{label}} tick {{i}}", flush=True)
    time.sleep(gap)
out = os.environ["FLOOM_OUTPUT_DIR"]
with open(out + "/report.csv", "w") as f:
    f.write("tick,label\\n" + "".join(f"{{i}},{{label}}\\n" for i in range(1, inputs["ticks"] + 1)))
json.dump({{"label": label, "extra": inputs.get("extra")}}, open(out + "/summary.json", "w"))
open(out + "/pixel.png", "wb").write(base64.b64decode("{PIXEL_PNG}"))
json.dump({{"outputs": {{"done": inputs["ticks"]}}}}, open("result.json", "w"))
"""

GATED_YML = """\
name: publisher
description: Drafts a title; a person approves it before it is published.
outputs:
  title: {type: string, required: true}
approvals: {required: true}
"""
GATED_PY = """\
import json, os
if os.environ["FLOOM_PHASE"] == "propose":
    json.dump({"outputs": {"title": "Draft title"}}, open("result.json", "w"))
else:
    d = json.load(open("decision.json"))
    print("publishing", d["outputs"]["title"], flush=True)
    json.dump({"outputs": d["outputs"]}, open("result.json", "w"))
"""


@contextmanager
def launched_chromium() -> Iterator[Any]:
    """Debian's Chromium driven by Playwright; Playwright's own browsers are never fetched."""
    from playwright.sync_api import sync_playwright

    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS, headless=True)
        try:
            yield browser
        finally:
            browser.close()


@pytest.fixture(name="database_url")
def sqlite_database_url(tmp_path: Path) -> str:
    """Browser tests run on SQLite only, to keep them quick (the plain-HTTP UI tests cover
    both databases). A module takes it with `database_url = sqlite_database_url`."""
    return f"sqlite:///{tmp_path / 'floom.db'}"


@pytest.fixture(scope="module")
def browser() -> Iterator[Any]:
    """One Chromium per module; each test gets its own context (cookies, storage)."""
    if not Path(CHROMIUM).exists():
        if os.environ.get("CI"):
            pytest.fail(f"Chromium is required in CI but missing at {CHROMIUM}")
        pytest.skip(f"Chromium not installed at {CHROMIUM} (apt-get install chromium)")
    with launched_chromium() as instance:
        yield instance


@pytest.fixture
def tab(browser: Any, server: LiveServer) -> Iterator[Tab]:
    t = Tab(browser, server)
    yield t
    t.close()
    assert t.problems == [], t.problems


class Tab:
    """A page in its own browser context, recording script errors and failed loads."""

    def __init__(self, browser: Any, server: LiveServer, **options: Any) -> None:
        self.server = server
        self.context = browser.new_context(
            viewport=options.pop("viewport", {"width": 1280, "height": 900}),
            timezone_id="America/New_York",
            locale="en-US",
            **options,
        )
        self.context.set_default_timeout(WAIT_MS)
        self.page: Any = self.context.new_page()
        self.page.on("dialog", lambda dialog: dialog.accept())
        self.problems: list[str] = []
        self.page.on("pageerror", lambda exc: self.problems.append(f"script error: {exc}"))
        self.page.on("console", self._console)
        self.page.on("response", self._response)

    def _console(self, msg: Any) -> None:
        # A page answered with 4xx (a refused form, a wrong key) is logged as a failed load;
        # failed sub-resources are caught by _response instead.
        if msg.type == "error" and not msg.text.startswith("Failed to load resource"):
            self.problems.append(f"console: {msg.text}")

    def _response(self, response: Any) -> None:
        if response.status >= 400 and response.request.resource_type != "document":
            self.problems.append(f"{response.status} for {response.url}")

    def url(self, path: str) -> str:
        return self.server.base_url + path

    def goto(self, path: str) -> Any:
        return self.page.goto(self.url(path))

    def sign_in(self, key: str | None = None) -> None:
        self.goto("/login")
        self.page.get_by_label("API key").fill(key or self.server.admin_key)
        self.page.get_by_role("button", name="Sign in").click()
        self.page.wait_for_url(self.url("/"))

    def shot(self, name: str) -> None:
        SHOTS.mkdir(parents=True, exist_ok=True)
        self.page.screenshot(path=str(SHOTS / f"{name}.png"), full_page=True)

    def close(self) -> None:
        self.context.close()


def run_id_of(url: str) -> str:
    match = re.search(r"/runs/(run_[0-9a-f]+)", url)
    assert match, url
    return match.group(1)


def csrf_of(html: str) -> str:
    match = re.search(r'name="csrf" value="([^"]+)"', html)
    assert match, "no CSRF field in the page"
    return match.group(1)


def signed_in_client(server: LiveServer, key: str) -> httpx.Client:
    """An HTTP client holding a UI session cookie, signed in through the login form."""
    client = server.client(key="")  # no API key: the session cookie signs it in
    form = client.get("/login")
    done = client.post("/login", data={"csrf": csrf_of(form.text), "api_key": key, "next": "/"})
    assert done.status_code == 303, done.text
    assert done.headers["location"] == "/", done.text
    return client
