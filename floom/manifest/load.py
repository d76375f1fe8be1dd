"""Reading worker.yml into a Manifest: from text with the folder's file list, or from a
folder on disk. Each entry point gives the manifest or every problem found (check_*), or
raises ManifestInvalid listing them (parse_manifest, load_folder)."""

from __future__ import annotations

import stat
from collections.abc import Iterable, Mapping
from pathlib import Path, PurePosixPath
from typing import Any

from pydantic import ValidationError

from floom.bundle import folder_entries, is_env_file, read_folder_file
from floom.errors import BundleInvalid, ManifestInvalid, ManifestTooLarge
from floom.manifest.checks import check_document, load_yaml
from floom.manifest.fields import kind_of
from floom.manifest.schema import (
    MAX_MANIFEST_BYTES,
    Manifest,
    Problem,
    manifest_too_large,
)


def check_manifest(text: str, files: Iterable[str]) -> tuple[Manifest | None, list[Problem]]:
    """Validate worker.yml text against the folder's file list (relative posix paths).

    Returns the manifest and no problems, or None and every problem found. A document over a
    parser limit (bytes, depth, nodes) or with YAML anchors or aliases is not read at all:
    that raises ManifestTooLarge or ManifestAliasesRefused.
    """
    _check_size(text)
    file_set = frozenset(PurePosixPath(f).as_posix() for f in files)
    doc, problems = load_yaml(text)
    if problems:
        return None, problems
    if doc is None:
        return None, [Problem("", "worker.yml is empty", "add at least name: my-worker")]
    if not isinstance(doc, Mapping):
        message = f"worker.yml must be a mapping of keys to values, got {kind_of(doc)}"
        return None, [Problem("", message, "start it with a line like name: my-worker")]
    clean, problems = check_document(doc, file_set)
    if problems:
        return None, problems
    try:
        return Manifest.model_validate(clean), []
    except ValidationError as exc:  # a rule the checks above missed; still report, not crash
        return None, [_from_pydantic(error) for error in exc.errors()]


def parse_manifest(text: str, files: Iterable[str]) -> Manifest:
    """Like check_manifest, but raises ManifestInvalid listing every problem."""
    manifest, problems = check_manifest(text, files)
    if manifest is None:
        raise manifest_invalid(problems)
    return manifest


def list_worker_files(folder: Path) -> list[str]:
    """Relative posix paths of the files under folder that a deploy ships (bundle.py's one
    walk: no link followed, VCS, cache and env folders unwalked, environment files left
    behind, at most MAX_ENTRIES entries)."""
    return sorted(
        rel
        for rel, mode in folder_entries(folder)
        if not stat.S_ISDIR(mode) and not is_env_file(rel)
    )


def check_folder(folder: Path) -> tuple[Manifest | None, list[Problem]]:
    """check_manifest for a worker folder on disk. worker.yml is read as a regular file of
    the folder only (never through a link, never waiting on a FIFO), up to its bound."""
    if not folder.is_dir():
        return None, [Problem("", f"{folder} is not a folder", "point at a worker's folder")]
    try:
        data = read_folder_file(folder, "worker.yml", limit=MAX_MANIFEST_BYTES)
    except FileNotFoundError:
        hint = "create worker.yml with at least name:"
        if (folder / "worker.yaml").is_file():
            hint = "rename worker.yaml to worker.yml"
        return None, [Problem("", f"no worker.yml in {folder}", hint)]
    except BundleInvalid as exc:
        return None, [Problem("", exc.message, exc.advice)]
    if len(data) > MAX_MANIFEST_BYTES:
        raise _too_many_bytes()
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError:
        return None, [Problem("", "worker.yml is not UTF-8 text", "save it as UTF-8")]
    return check_manifest(text, list_worker_files(folder))


def load_folder(folder: Path) -> Manifest:
    """Read and validate a worker folder's worker.yml; raises ManifestInvalid."""
    manifest, problems = check_folder(folder)
    if manifest is None:
        raise manifest_invalid(problems)
    return manifest


# -- helpers -----------------------------------------------------------------------------------


def _too_many_bytes() -> ManifestTooLarge:
    return manifest_too_large(
        limit="bytes",
        maximum=MAX_MANIFEST_BYTES,
        message=f"worker.yml is larger than {MAX_MANIFEST_BYTES // 1024} KiB",
        hint="keep worker.yml to settings; put data in files next to it and read them at run time",
    )


def _check_size(text: str) -> None:
    # Characters never outnumber bytes in UTF-8, so a long text is refused without encoding.
    if len(text) > MAX_MANIFEST_BYTES or len(text.encode("utf-8")) > MAX_MANIFEST_BYTES:
        raise _too_many_bytes()


def manifest_invalid(problems: list[Problem]) -> ManifestInvalid:
    """The ManifestInvalid that lists `problems` (each in details, with its hint)."""
    count = len(problems)
    shown = "; ".join(f"{p.path or 'worker.yml'}: {p.message}" for p in problems[:5])
    more = f"; and {count - 5} more" if count > 5 else ""
    plural = "problem" if count == 1 else "problems"
    hint = problems[0].hint if count == 1 else "each problem in details has its own hint"
    return ManifestInvalid(
        f"worker.yml has {count} {plural}: {shown}{more}",
        hint=hint,
        details=[p.to_dict() for p in problems],
    )


def _from_pydantic(error: Any) -> Problem:
    path = ""
    for part in error["loc"]:
        path += f"[{part}]" if isinstance(part, int) else (f".{part}" if path else str(part))
    return Problem(path, error["msg"])
