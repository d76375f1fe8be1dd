"""Page layout measured in Chromium: boxes that must not overlap or spill out of their form."""

from __future__ import annotations

from typing import Any

import pytest

from tests.support import web as web_support
from tests.support.harness import LiveServer
from tests.support.web import Tab

database_url = web_support.sqlite_database_url
browser = web_support.browser


def _overlap(a: dict[str, float], b: dict[str, float]) -> bool:
    return (
        a["x"] < b["x"] + b["width"]
        and b["x"] < a["x"] + a["width"]
        and a["y"] < b["y"] + b["height"]
        and b["y"] < a["y"] + a["height"]
    )


def _inside(inner: dict[str, float], outer: dict[str, float]) -> bool:
    return (
        inner["x"] >= outer["x"] - 0.5
        and inner["y"] >= outer["y"] - 0.5
        and inner["x"] + inner["width"] <= outer["x"] + outer["width"] + 0.5
        and inner["y"] + inner["height"] <= outer["y"] + outer["height"] + 0.5
    )


@pytest.mark.parametrize("width", [1280, 700, 390])
def test_the_runs_filters_sit_side_by_side_inside_their_form_at_any_width(
    browser: Any,
    server: LiveServer,
    width: int,
) -> None:
    tab = Tab(browser, server, viewport={"width": width, "height": 900})
    try:
        tab.sign_in()
        tab.goto("/runs")
        form = tab.page.locator("form.filters").bounding_box()
        boxes = {
            name: tab.page.locator(f"form.filters [name={name}]").bounding_box()
            for name in ("worker", "status", "trigger", "since", "after", "before")
        }
        boxes["button"] = tab.page.locator("form.filters button").bounding_box()
        for name, box in boxes.items():
            assert _inside(box, form), (width, name, box, form)
        names = list(boxes)
        for i, a in enumerate(names):
            for b in names[i + 1 :]:
                assert not _overlap(boxes[a], boxes[b]), (width, a, boxes[a], b, boxes[b])
        assert tab.problems == []
    finally:
        tab.close()
