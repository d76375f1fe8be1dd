"""The docs site (docs/, mkdocs.yml): it builds in strict mode, so a broken link or anchor
fails the suite; its generated reference pages match the code they come from; and the README
stays a front page that points into it."""

from __future__ import annotations

import importlib.util
import os
import re
import subprocess
import sys
from pathlib import Path
from types import ModuleType

from floom.config import Settings
from tests.support.harness import REPO

DOCS = REPO / "docs"


def test_the_site_builds_in_strict_mode(tmp_path: Path) -> None:
    done = subprocess.run(
        [sys.executable, "-m", "mkdocs", "build", "--strict", "--site-dir", str(tmp_path)],
        cwd=REPO,
        env={**os.environ, "NO_MKDOCS_2_WARNING": "1"},
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    assert (tmp_path / "reference" / "error-codes" / "index.html").is_file()
    # The home page takes the README's quick start as it is (a snippet, not a copy).
    home = (tmp_path / "index.html").read_text()
    assert "./dev serve" in home
    assert "./dev test" in home


def test_the_generated_reference_pages_match_the_code() -> None:
    done = subprocess.run(
        [sys.executable, str(REPO / "dev-tools" / "docs_reference.py"), "--check"],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stderr


def test_a_broken_link_fails_the_strict_build(tmp_path: Path) -> None:
    site = tmp_path / "project"
    (site / "docs").mkdir(parents=True)
    (site / "mkdocs.yml").write_text(
        (REPO / "mkdocs.yml").read_text().split("\nnav:")[0].replace("!relative $config_dir", ".")
    )
    (site / "docs" / "index.md").write_text("# x\n\n[gone](gone.md) and [here](#nowhere)\n")
    done = subprocess.run(
        [sys.executable, "-m", "mkdocs", "build", "--strict", "--site-dir", str(tmp_path / "out")],
        cwd=site,
        env={**os.environ, "NO_MKDOCS_2_WARNING": "1"},
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode != 0
    assert "gone.md" in done.stderr
    assert "nowhere" in done.stderr


def test_every_setting_is_explained_in_the_configuration_page() -> None:
    text = (DOCS / "reference" / "configuration.md").read_text()
    missing = [
        f"FLOOM_{name.upper()}"
        for name in Settings.model_fields
        if f"`FLOOM_{name.upper()}`" not in text
    ]
    assert missing == []


def test_the_readme_is_a_front_page_with_the_quick_start_and_links_that_resolve() -> None:
    readme = (REPO / "README.md").read_text()
    assert len(readme.splitlines()) < 200
    assert "./dev serve        # installs floom" in readme
    assert "./dev test         # installs the test tools" in readme
    links = re.findall(r"\]\((docs/[^)#]+)", readme)
    assert len(links) >= 20
    assert [link for link in links if not (REPO / link).is_file()] == []
    # Every docs page is reachable from the README's table or the site's navigation.
    nav = (REPO / "mkdocs.yml").read_text()
    pages = [p.relative_to(DOCS).as_posix() for p in DOCS.rglob("*.md")]
    assert [p for p in pages if p not in nav] == []


def test_the_mcp_page_states_the_node_22_requirement_before_the_transports() -> None:
    page = (DOCS / "how-to" / "mcp-clients.md").read_text()
    assert page.index("Node 22 or newer") < page.index("The two transports")


def _readme_to_docs() -> ModuleType:
    spec = importlib.util.spec_from_file_location(
        "readme_to_docs", REPO / "dev-tools" / "readme_to_docs.py"
    )
    assert spec is not None
    assert spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_a_readme_section_moves_into_a_page_with_its_headings_links_and_nav_entry() -> None:
    tool = _readme_to_docs()
    readme = [
        "# floom",
        "## Alerts",
        "See [Triggers](docs/how-to/triggers.md#schedules).",
        "### Channels",
        "```yaml",
        "### not a heading",
        "```",
        "## Documentation",
    ]
    start, end, level = tool.section_bounds(readme, "Alerts")
    assert (start, end, level) == (1, 7, 2)
    assert tool.section_bounds(readme, "Channels") == (3, 7, 3)
    body = tool.shifted(tool.relinked(readme[start + 1 : end], "how-to/alerts.md"), level - 1)
    assert body == [
        "See [Triggers](triggers.md#schedules).",
        "## Channels",
        "```yaml",
        "### not a heading",
        "```",
    ]
    config = (REPO / "mkdocs.yml").read_text()
    added = tool.add_to_nav(config, "How-to guides", "Pagers", "how-to/pagers.md")
    group = added[added.index("  - How-to guides:") : added.index("  - Reference:")]
    assert group.rstrip().endswith("- Pagers: how-to/pagers.md")
    assert tool.add_to_nav(added, "How-to guides", "Pagers", "how-to/pagers.md") == added


def test_the_map_of_the_old_readme_sections_names_pages_that_exist() -> None:
    moved = _readme_to_docs().MOVED
    assert len(moved) >= 25
    assert [p for p in moved.values() if not (DOCS / p.split(" ")[0]).is_file()] == []
