"""/docs (Swagger UI) and /redoc work offline: every script, style and image they load is
served by floom itself from the installed package, not fetched from a CDN."""

from __future__ import annotations

import re
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from tests.support.harness import LiveServer, live_server

_KINDS = {".js": "javascript", ".css": "text/css", ".png": "image/png"}


@pytest.fixture
def server(tmp_path: Path) -> Iterator[LiveServer]:
    with live_server(tmp_path / "data", f"sqlite:///{tmp_path / 'floom.db'}") as running:
        yield running


def loaded_urls(page: str) -> list[str]:
    """What a browser fetches for this page: src and href attributes, and the URLs its
    inline script passes to the UI (the OpenAPI document, the OAuth2 redirect)."""
    attributes = re.findall(r"""(?:src|href)\s*=\s*["']([^"']+)["']""", page)
    quoted = re.findall(r"""["'](/[^"'\s]*|https?://[^"'\s]+)["']""", page)
    return sorted(set(attributes) | set(quoted))


@pytest.mark.parametrize("path", ["/docs", "/redoc"])
def test_the_api_reference_page_loads_only_local_urls_that_answer_with_the_asset(
    server: LiveServer, path: str
) -> None:
    with httpx.Client(base_url=server.base_url, timeout=10) as browser:
        page = browser.get(path)
        assert page.status_code == 200, page.text
        urls = loaded_urls(page.text)
        assert urls, page.text
        assert [u for u in urls if not u.startswith("/")] == [], page.text
        assets = [u for u in urls if u.startswith("/docs/assets/")]
        scripts = [u for u in assets if u.endswith(".js")]
        assert scripts, urls  # the page is blank without its script
        for url in urls:
            answer = browser.get(url)
            assert answer.status_code == 200, url
            if url in assets:
                suffix = Path(url).suffix
                assert _KINDS[suffix] in answer.headers["content-type"], url
                assert len(answer.content) > 1000, url
        assert "/openapi.json" in urls
        if path == "/docs":
            assert '"validatorUrl": null' in page.text  # no badge from the online validator
