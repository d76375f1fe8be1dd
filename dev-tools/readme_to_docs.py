#!/usr/bin/env python3
"""Moves one section of README.md (a `##`, `###` or `####` heading and what follows it) into
a page of the docs site, for sections written into the README after the reference moved to
docs/ (a branch merged later, say).

    python dev-tools/readme_to_docs.py "Alerts" how-to/alerts.md "How-to guides"

takes the README's `## Alerts` section (its heading down to the next heading of its level or
above), writes it
as docs/how-to/alerts.md with the section's title as the page's `#` title, every heading
under it one level up (code blocks untouched) and its links into docs/ made relative to the
page, removes it from the README, and adds the page
to mkdocs.yml's nav under the named group (Tutorials, How-to guides, Reference or
Explanation). A page that exists already gets the section appended as a `##` section and
keeps its nav entry. With `--from FILE` the section is read from that file and README.md is
left alone: after a merge that conflicts in the README (a branch that still added to the old
long README),

    git show h/branch:README.md > /tmp/theirs.md && git checkout --ours README.md
    python dev-tools/readme_to_docs.py "Worker state" how-to/worker-state.md \
        "How-to guides" --from /tmp/theirs.md

Then run tests/unit/test_docs.py: the strict build names any link to fix. Text a branch
added inside one of the old README's sections goes to that section's page:

    python dev-tools/readme_to_docs.py --map      # old README section -> docs page
Standard library only.
"""

from __future__ import annotations

import argparse
import os
import re
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
GROUPS = ("Tutorials", "How-to guides", "Reference", "Explanation")
# Where each section of the long README went (docs/...), for text a branch added to it.
MOVED = {
    "Concepts": "explanation/concepts.md",
    "Writing a worker": "how-to/script-workers.md",
    "worker.yml reference": "reference/worker-yml.md",
    "Exposing a worker": "reference/worker-yml.md",
    "Network": "how-to/network.md",
    "Resource limits": "reference/resource-limits.md",
    "Sandbox uids": "reference/resource-limits.md",
    "Running scripts in E2B": "how-to/e2b.md",
    "Agent workers": "how-to/agent-workers.md",
    "Testing agent changes against real runs": "explanation/replay.md",
    "Triggers": "how-to/triggers.md",
    "Deleting a worker": "how-to/delete-a-worker.md",
    "CLI reference": "reference/cli-notes.md (and the generated reference/cli.md)",
    "MCP: floom in your coding agent": "how-to/mcp-clients.md",
    "Web UI": "how-to/web-ui.md",
    "REST API": "reference/rest.md",
    "Error codes": "reference/error-codes.md (generated: dev-tools/docs_reference.py)",
    "Handoffs": "how-to/handoffs.md",
    "Security model": "explanation/security-model.md",
    "Configuration": "reference/configuration.md",
    "How runs survive failures": "explanation/runs-survive-failures.md",
    "Cluster internals: wake-ups, limits, the scheduler": "explanation/cluster-internals.md",
    "Running several nodes": "how-to/cluster.md",
    "Data and upgrades": "how-to/operations.md",
    "Operations": "how-to/operations.md (Metrics, Running as a service, TLS, Keys too)",
    "Known-good clients": "how-to/mcp-clients.md (the note that opens it)",
    "Benchmarks": "explanation/design.md",
    "Layout": "explanation/design.md",
    "Design notes": "explanation/design.md",
    "Worker state": "how-to/worker-state.md",
}


def section_bounds(lines: list[str], title: str) -> tuple[int, int, int]:
    """The README lines of the section headed `title` (`##`, `###` or `####`): its heading's
    index, the index after its end (the next heading of its level or above) and its level."""
    fence = False
    start, level = None, 0
    for i, line in enumerate(lines):
        if line.startswith("```"):
            fence = not fence
            continue
        match = None if fence else re.match(r"^(#{2,4}) (.*)$", line)
        if match is None:
            continue
        if start is not None and len(match.group(1)) <= level:
            return start, i, level
        if start is None and match.group(2).strip() == title:
            start, level = i, len(match.group(1))
    if start is None:
        raise SystemExit(f"README.md has no section headed '{title}'")
    return start, len(lines), level


def shifted(lines: list[str], by: int) -> list[str]:
    """Headings `by` levels up (never above `##`), outside code blocks."""
    out, fence = [], False
    for line in lines:
        if line.startswith("```"):
            fence = not fence
        elif not fence and (match := re.match(r"^(#{3,6}) ", line)):
            line = "#" * max(2, len(match.group(1)) - by) + line[len(match.group(1)) :]
        out.append(line)
    return out


def relinked(lines: list[str], page: str) -> list[str]:
    """The README's links into docs/ made relative to the page (`docs/how-to/x.md` from
    how-to/y.md is `x.md`)."""
    here = os.path.dirname(page) or "."

    def relative(match: re.Match[str]) -> str:
        return "](" + os.path.relpath(match.group(1), here).replace(os.sep, "/")

    return [re.sub(r"\]\(docs/([^)]+)", relative, line) for line in lines]


def add_to_nav(config: str, group: str, title: str, page: str) -> str:
    if f": {page}\n" in config:
        return config
    lines = config.split("\n")
    head = lines.index(f"  - {group}:")
    end = head + 1
    while end < len(lines) and lines[end].startswith("      - "):
        end += 1
    lines.insert(end, f"      - {title}: {page}")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0] if __doc__ else "")
    if (sys.argv[1:] if argv is None else argv) == ["--map"]:
        for section, page in MOVED.items():
            print(f"{section:50} docs/{page}")
        return 0
    parser.add_argument("section", help="the README's heading, as written, without the #s")
    parser.add_argument("page", help="the page under docs/, e.g. how-to/alerts.md")
    parser.add_argument("group", choices=GROUPS, help="the nav group of a new page")
    parser.add_argument(
        "--from",
        dest="source",
        type=Path,
        help="read the section from this file (another branch's README, say) and leave "
        "README.md as it is",
    )
    args = parser.parse_args(argv)
    readme = args.source or REPO / "README.md"
    lines = readme.read_text().split("\n")
    start, end, level = section_bounds(lines, args.section)
    body = relinked(lines[start + 1 : end], args.page)
    page = REPO / "docs" / args.page
    if page.exists():
        added = [f"## {args.section}", *shifted(body, level - 2)]
        text = page.read_text().rstrip() + "\n\n" + "\n".join(added)
    else:
        text = "\n".join([f"# {args.section}", *shifted(body, level - 1)])
        page.parent.mkdir(parents=True, exist_ok=True)
    page.write_text(re.sub(r"\n{3,}", "\n\n", text).rstrip() + "\n")
    if args.source is None:
        readme.write_text("\n".join(lines[:start] + lines[end:]))
    config = REPO / "mkdocs.yml"
    config.write_text(add_to_nav(config.read_text(), args.group, args.section, args.page))
    print(f"moved '{lines[start]}' ({end - start} lines) to docs/{args.page}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
