#!/usr/bin/env python3
"""Moves one `## Section` of README.md into a page of the docs site, for sections written
into the README after the reference moved to docs/ (a branch merged later, say).

    python dev-tools/readme_to_docs.py "Alerts" how-to/alerts.md "How-to guides"

takes the README's `## Alerts` section (its heading down to the next `##` heading), writes it
as docs/how-to/alerts.md with the section's title as the page's `#` title, every heading
under it one level up (code blocks untouched) and its links into docs/ made relative to the
page, removes it from the README, and adds the page
to mkdocs.yml's nav under the named group (Tutorials, How-to guides, Reference or
Explanation). A page that exists already gets the section appended as a `##` section and
keeps its nav entry. Then run tests/unit/test_docs.py: the strict build names any link to fix.
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


def section_bounds(lines: list[str], title: str) -> tuple[int, int]:
    """The README lines of `## title`: its heading's index and the index after its end."""
    fence = False
    start = None
    for i, line in enumerate(lines):
        if line.startswith("```"):
            fence = not fence
        elif not fence and line.startswith("## "):
            if start is not None:
                return start, i
            if line[3:].strip() == title:
                start = i
    if start is None:
        raise SystemExit(f"README.md has no section '## {title}'")
    return start, len(lines)


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
    parser.add_argument("section", help="the README's `## ` heading, as written")
    parser.add_argument("page", help="the page under docs/, e.g. how-to/alerts.md")
    parser.add_argument("group", choices=GROUPS, help="the nav group of a new page")
    args = parser.parse_args(argv)
    readme = REPO / "README.md"
    lines = readme.read_text().split("\n")
    start, end = section_bounds(lines, args.section)
    body = relinked(lines[start + 1 : end], args.page)
    page = REPO / "docs" / args.page
    if page.exists():
        text = page.read_text().rstrip() + "\n\n" + "\n".join([f"## {args.section}", *body])
    else:
        text = "\n".join([f"# {args.section}", *shifted(body, 1)])
        page.parent.mkdir(parents=True, exist_ok=True)
    page.write_text(re.sub(r"\n{3,}", "\n\n", text).rstrip() + "\n")
    readme.write_text("\n".join(lines[:start] + lines[end:]))
    config = REPO / "mkdocs.yml"
    config.write_text(add_to_nav(config.read_text(), args.group, args.section, args.page))
    print(f"moved '## {args.section}' ({end - start} lines) to docs/{args.page}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
