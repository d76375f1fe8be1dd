"""What changed between two versions of a worker: the manifest and every file, as unified diffs."""

from __future__ import annotations

import difflib
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Literal

from floom.services.access.principal import Principal
from floom.services.workers import versions as workers

if TYPE_CHECKING:
    from floom.bundle import Bundle
    from floom.services.context import Context
    from floom.store.models import Version

# Diffs of bigger files are slow to compute and useless to read in a browser.
MAX_DIFF_BYTES = 256 * 1024
CONTEXT_LINES = 3

FileStatus = Literal["added", "removed", "changed", "unchanged"]


@dataclass(frozen=True)
class FileDiff:
    path: str
    status: FileStatus
    old_size: int | None
    new_size: int | None
    # Unified diff lines without the ---/+++ header; empty for binary or oversized files.
    lines: list[str] = field(default_factory=list)
    text: bool = True


@dataclass(frozen=True)
class VersionDiff:
    worker: str
    old: Version
    new: Version
    files: list[FileDiff]

    @property
    def changed(self) -> list[FileDiff]:
        return [f for f in self.files if f.status != "unchanged"]


def _as_text(data: bytes | None) -> str | None:
    if data is None:
        return ""
    if len(data) > MAX_DIFF_BYTES or b"\0" in data:
        return None
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError:
        return None


def _diff_lines(old: str, new: str, path: str) -> list[str]:
    lines = difflib.unified_diff(
        old.splitlines(),
        new.splitlines(),
        fromfile=f"a/{path}",
        tofile=f"b/{path}",
        n=CONTEXT_LINES,
        lineterm="",
    )
    return [line for line in lines if not line.startswith(("---", "+++"))]


def _file_diff(path: str, old: Bundle, new: Bundle) -> FileDiff:
    a = old.files.get(path)
    b = new.files.get(path)
    old_data = a.data if a else None
    new_data = b.data if b else None
    status: FileStatus
    if a is None:
        status = "added"
    elif b is None:
        status = "removed"
    elif old_data == new_data and a.executable == b.executable:
        status = "unchanged"
    else:
        status = "changed"
    sizes = (
        len(old_data) if old_data is not None else None,
        len(new_data) if new_data is not None else None,
    )
    if status == "unchanged":
        return FileDiff(path, status, sizes[0], sizes[1])
    old_text, new_text = _as_text(old_data), _as_text(new_data)
    if old_text is None or new_text is None:
        return FileDiff(path, status, sizes[0], sizes[1], text=False)
    lines = _diff_lines(old_text, new_text, path)
    if not lines and a and b and a.executable != b.executable:
        mode = "executable" if b.executable else "not executable"
        lines = [f"(content unchanged; the file is now {mode})"]
    return FileDiff(path, status, sizes[0], sizes[1], lines=lines)


def diff_versions(
    ctx: Context, *, worker_name: str, old_id: str, new_id: str, caller: Principal
) -> VersionDiff:
    """Compare two versions of one worker, worker.yml first, then the files by path. Needs
    the read scope."""
    old = workers.get_version(ctx, version_id=old_id, worker_name=worker_name, caller=caller)
    new = workers.get_version(ctx, version_id=new_id, worker_name=worker_name, caller=caller)
    old_bundle = workers.load_bundle(ctx, version=old)
    new_bundle = workers.load_bundle(ctx, version=new)
    paths = sorted(set(old_bundle.files) | set(new_bundle.files))
    # The stored manifest text is what was deployed; it leads because it says the most.
    paths.sort(key=lambda p: p != "worker.yml")
    files = [_file_diff(p, old_bundle, new_bundle) for p in paths]
    return VersionDiff(worker=worker_name, old=old, new=new, files=files)
