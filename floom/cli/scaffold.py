"""The init command: a new worker folder that validates, deploys and runs as it is written."""

from __future__ import annotations

import errno
import os
import re
import shutil
import tempfile
from pathlib import Path
from typing import Annotated

import typer
from rich.text import Text

from floom.cli.output import fail, out


def register(app: typer.Typer) -> None:
    """Add the init command to the floom command."""
    app.command()(init)


def init(
    name: Annotated[str, typer.Argument(help="the worker's name, and the folder made for it")],
    agent: Annotated[
        bool, typer.Option("--agent", help="an agent worker (SKILL.md) instead of a script")
    ] = False,
) -> None:
    """Create a worker folder (worker.yml, run.py or SKILL.md, README.md) that deploys as is."""
    # Imported here, not at the top: the manifest schema costs ~27 ms of CLI start-up.
    from floom.manifest.schema import NAME_PATTERN

    if not re.fullmatch(NAME_PATTERN, name):
        slug = re.sub(r"[^a-z0-9]+", "-", name.lower()).strip("-")[:63]
        hint = 'use lowercase letters, digits and dashes, starting with a letter, e.g. "my-worker"'
        if re.fullmatch(NAME_PATTERN, slug):
            hint = f'use lowercase letters, digits and dashes, starting with a letter: try "{slug}"'
        fail(f"{name!r} is not a valid worker name (it names the worker and its folder)", hint)
    folder = Path.cwd() / name
    if folder.is_symlink() or (folder.exists() and not folder.is_dir()):
        fail(f"{name} already exists and is not a folder", "choose another name, or move it")
    if folder.is_dir() and any(folder.iterdir()):
        fail(
            f"{name}/ already exists and is not empty; nothing was written",
            "choose another name, or remove the folder (an empty one is used as it is)",
        )
    files = agent_files(name) if agent else script_files(name)
    _write_whole(folder, files)
    out.print(Text(f"created {name}/: {', '.join(sorted(files))}"))
    out.print(Text(f"next: floom validate {name} && floom deploy {name}"))
    if agent:
        out.print(
            Text(f"then: floom run {name} -i topic=floom --wait   (needs FLOOM_ANTHROPIC_API_KEY)")
        )
    else:
        out.print(Text(f"then: floom run {name} -i name=Ada --wait"))


def _write_whole(folder: Path, files: dict[str, str]) -> None:
    """Write every file into a fresh folder next to `folder`, then rename it into place: an
    interrupted init leaves no half-written worker, and a folder that filled up meanwhile is
    not overwritten (rename refuses a non-empty target)."""
    staging: Path | None = None
    try:
        staging = Path(tempfile.mkdtemp(prefix=f".{folder.name}.", dir=folder.parent))
        for rel, text in files.items():
            (staging / rel).write_text(text, encoding="utf-8")
        staging.chmod(0o755)
        os.rename(staging, folder)
    except OSError as exc:
        if exc.errno in (errno.ENOTEMPTY, errno.EEXIST, errno.ENOTDIR):
            fail(
                f"{folder.name}/ already exists and is not empty; nothing was written",
                "choose another name, or remove the folder",
            )
        fail(
            f"could not write {folder.name}/: {exc.strerror or exc}; nothing was written",
            "run it in a folder you can write to",
        )
    finally:
        if staging is not None:
            shutil.rmtree(staging, ignore_errors=True)


def _title(name: str) -> str:
    return name.replace("-", " ").capitalize()


def script_files(name: str) -> dict[str, str]:
    """A Python script worker: one input, one output, an artifact."""
    manifest = f"""\
# A floom worker: this file and its entry file (run.py, found by its name). Every field is
# described in floom's docs, docs/reference/worker-yml.md; floom validate FOLDER checks it.
name: {name}                 # the worker's name: lowercase letters, digits and dashes
title: {_title(name)}
description: Greets someone by name.

# What a run takes: run.py reads them from inputs.json, checked and with defaults filled in.
# Types: string, integer, number, boolean, object, array, file.
inputs:
  name:
    type: string
    default: world
    description: Who to greet.

# What a run reports: run.py writes them to result.json; a run whose outputs do not match
# these fails. Without outputs:, any outputs are taken.
outputs:
  greeting:
    type: string
    required: true

# Per run, for the script's whole process tree.
limits:
  timeout_seconds: 60
  memory_mb: 256

# More when you need it (see floom's docs): secrets: [NAME] (set with floom secrets set NAME),
# network: full (no network by default), retries: 2, triggers: (schedules, webhooks),
# approvals: {{required: true}} (a person approves the outputs first).
"""
    run = """\
\"\"\"Runs in floom's sandbox: reads inputs.json, prints log lines, leaves artifacts in
$FLOOM_OUTPUT_DIR and reports its outputs in result.json.\"\"\"

import json
import os
from pathlib import Path

inputs = json.loads(Path("inputs.json").read_text())
greeting = f"Hello, {inputs['name']}!"
print(greeting)  # stdout and stderr become the run's log, line by line

# Every file left in the output dir becomes a downloadable artifact of the run.
(Path(os.environ["FLOOM_OUTPUT_DIR"]) / "greeting.txt").write_text(greeting + "\\n")

# The outputs, checked against worker.yml's outputs:. To fail the run, report
# {"error": "what went wrong", "retryable": false} instead (or exit non-zero).
Path("result.json").write_text(json.dumps({"outputs": {"greeting": greeting}}))
"""
    readme = f"""\
# {name}

A floom script worker. Edit `run.py` and `worker.yml`, then:

```sh
floom validate {name}                   # check it locally
floom deploy {name}                     # upload it as a new version
floom run {name} -i name=Ada --wait     # run it, following its log
```

`run.py` reads `inputs.json`, writes its outputs to `result.json` and leaves artifacts in
`$FLOOM_OUTPUT_DIR`. It runs in a sandbox without network unless worker.yml says
`network: full`. Every file of this folder is deployed with it.
"""
    return {"worker.yml": manifest, "run.py": run, "README.md": readme}


def agent_files(name: str) -> dict[str, str]:
    """An agent worker: a brief in SKILL.md, one input, one output, one tool."""
    manifest = f"""\
# A floom agent worker: this file and SKILL.md, the brief the model follows with the tools
# below. Every field is described in floom's docs (docs/reference/worker-yml.md and
# docs/how-to/agent-workers.md); floom validate FOLDER checks it. The server needs
# FLOOM_ANTHROPIC_API_KEY.
name: {name}                 # the worker's name: lowercase letters, digits and dashes
title: {_title(name)}
description: Writes a short note about a topic.
# model: claude-sonnet-4-5   # default: the server's FLOOM_MODEL

# What a run takes; the model sees them with the brief.
inputs:
  topic:
    type: string
    default: floom
    description: What to write about.

# What the agent reports with its finish tool; floom checks them and sends problems back
# to the model.
outputs:
  summary:
    type: string
    required: true

# The only tools the model gets (finish is always there). Others: read_file, list_files,
# http_request (with allow_domains), run_command (in the sandbox), invoke_worker, remember,
# recall, request_approval, mcp and composio sources. `approval: always` on any tool makes
# a person approve each call.
tools:
  - builtin: write_file        # a file in the run's output dir: an artifact

# Per run: the loop stops at the first one reached.
limits:
  max_tool_iterations: 10
  max_total_tokens: 50000
  timeout_seconds: 300
  monthly_cost_usd: 5
"""
    skill = """\
# Note writer

You write a short note about the topic given in the `topic` input.

1. Write three or four plain sentences about the topic: what it is and why it matters.
2. Save them with `write_file` as `note.md`.
3. Call `finish` with `summary`: the note's first sentence.
"""
    readme = f"""\
# {name}

A floom agent worker: `SKILL.md` is its brief, `worker.yml` its inputs, outputs, tools and
limits. Edit them, then:

```sh
floom validate {name}                        # check it locally
floom deploy {name}                          # upload it as a new version
floom run {name} -i topic=floom --wait       # run it, following its log
```

The floom server needs `FLOOM_ANTHROPIC_API_KEY`. The model acts only through the tools
worker.yml lists; every call is recorded on the run.
"""
    return {"worker.yml": manifest, "SKILL.md": skill, "README.md": readme}
