"""Fetch a repository's activity since its last digest from the GitHub API and write a Markdown
digest. The worker's state (state.json, written back through result.json) holds, per
repository, when the last successful digest looked."""

from __future__ import annotations

import json
import os
import sys
import urllib.error
import urllib.request
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any, NoReturn

inputs = json.loads(Path("inputs.json").read_text())
repo, days, api = inputs["repo"], inputs["days"], inputs["api_url"].rstrip("/")
token = os.environ.get("GITHUB_TOKEN")


def finish(
    outputs: dict[str, Any] | None = None,
    error: str | None = None,
    retryable: bool = False,
    state: dict[str, Any] | None = None,
) -> NoReturn:
    result: dict[str, Any] = {"outputs": outputs or {}, "error": error, "retryable": retryable}
    if state is not None:
        result["state"] = state
    Path("result.json").write_text(json.dumps(result))
    sys.exit(0 if error is None else 1)


if not token:
    finish(error="GITHUB_TOKEN is not set; run `floom secrets set GITHUB_TOKEN`")

# null before the first digest; floom keeps the state only when this run succeeds.
state = json.loads(Path("state.json").read_text()) or {"since": {}}
started = datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
first_digest = repo not in state["since"]
if first_digest:
    since = (datetime.now(UTC) - timedelta(days=days)).strftime("%Y-%m-%dT%H:%M:%SZ")
else:
    since = state["since"][repo]
period = f"the last {days} days" if first_digest else f"since {since}"


def get(path: str) -> Any:
    req = urllib.request.Request(
        f"{api}{path}",
        headers={
            "Authorization": f"Bearer {token}",
            "Accept": "application/vnd.github+json",
            "User-Agent": "floom-github-digest",
        },
    )
    try:
        with urllib.request.urlopen(req, timeout=30) as resp:
            return json.load(resp)
    except urllib.error.HTTPError as exc:
        retry = exc.code >= 500 or exc.code == 429
        finish(error=f"GitHub answered {exc.code} for {path}", retryable=retry)
    except (urllib.error.URLError, TimeoutError) as exc:
        finish(error=f"cannot reach {api}: {exc}", retryable=True)


print(f"fetching activity of {repo} since {since}")
commits = get(f"/repos/{repo}/commits?since={since}&per_page=100")
issues = get(f"/repos/{repo}/issues?since={since}&state=all&per_page=100")
opened = [i for i in issues if i.get("created_at", "") >= since]
pulls = [i for i in opened if "pull_request" in i]
plain = [i for i in opened if "pull_request" not in i]

lines = [f"# {repo}: {period}", ""]
lines.append(f"- {len(commits)} commits, {len(plain)} issues opened, {len(pulls)} pull requests")
lines.append("")
lines.append("## Commits")
for c in commits[:20]:
    message = c["commit"]["message"].splitlines()[0]
    lines.append(f"- {c['sha'][:7]} {message}")
digest = "\n".join(lines) + "\n"
print(digest)
Path(os.environ["FLOOM_OUTPUT_DIR"], "digest.md").write_text(digest)

summary = (
    f"{repo}: {len(commits)} commits, {len(plain)} issues and {len(pulls)} pull requests "
    f"{'in ' if first_digest else ''}{period}"
)
finish(
    outputs={
        "summary": summary,
        "commits": len(commits),
        "issues_opened": len(plain),
        "pulls_opened": len(pulls),
    },
    # The next digest of this repository starts where this one looked.
    state={"since": {**state["since"], repo: started}},
)
