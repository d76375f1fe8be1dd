"""Reading what a run's process left behind on the host: result.json and the artifacts."""

from __future__ import annotations

import json
import mimetypes
from pathlib import Path
from typing import Any

Artifact = tuple[str, bytes, str]


def read_result(path: Path) -> tuple[dict[str, Any], str | None]:
    if not path.exists():
        return {}, None
    try:
        report = json.loads(path.read_text())
    except (ValueError, UnicodeDecodeError) as exc:
        return {}, f"result.json is not valid JSON ({exc})"
    if not isinstance(report, dict):
        return {}, 'result.json must be an object like {"outputs": {...}}'
    if "outputs" in report and not isinstance(report["outputs"], dict):
        return {}, 'result.json "outputs" must be an object of output names to values'
    return report, None


def collect_artifacts(output_dir: Path, *, limit: int) -> tuple[list[Artifact], str | None]:
    found: list[Artifact] = []
    total = 0
    for p in sorted(output_dir.rglob("*")):
        if p.is_symlink() or not p.is_file():
            continue
        size = p.stat().st_size
        if total + size > limit:
            return found, (
                f"artifacts over {limit // (1024 * 1024)} MiB were not kept "
                "(FLOOM_MAX_ARTIFACT_BYTES)"
            )
        total += size
        name = p.relative_to(output_dir).as_posix()
        content_type = mimetypes.guess_type(name)[0] or "application/octet-stream"
        found.append((name, p.read_bytes(), content_type))
    return found, None
