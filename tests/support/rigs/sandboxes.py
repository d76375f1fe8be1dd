"""Running a script in a real sandbox backend, for the sandbox tests."""

from __future__ import annotations

import textwrap
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

from floom.sandbox.base import Sandbox, SandboxResult, SandboxSpec

Lines = list[tuple[str, str]]


def run_script(
    sandbox: Sandbox,
    tmp_path: Path,
    script: str,
    *,
    on_line: Callable[[str, str], None] | None = None,
    should_cancel: Callable[[], bool] = lambda: False,
    command: list[str] | None = None,
    **spec_fields: Any,
) -> tuple[SandboxResult, Lines]:
    workdir = tmp_path / "work"
    output_dir = tmp_path / "output"
    workdir.mkdir(exist_ok=True)
    output_dir.mkdir(exist_ok=True)
    (workdir / "run.py").write_text(textwrap.dedent(script))
    lines: Lines = []

    def collect(stream: str, line: str) -> None:
        lines.append((stream, line))
        if on_line is not None:
            on_line(stream, line)

    spec = SandboxSpec(
        run_id=f"run-test-{uuid.uuid4().hex[:8]}",
        command=command or ["python3", "run.py"],
        workdir=workdir,
        output_dir=output_dir,
        **{"timeout_seconds": 30.0, **spec_fields},
    )
    return sandbox.run(spec, on_line=collect, should_cancel=should_cancel), lines
