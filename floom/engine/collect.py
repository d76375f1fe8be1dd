"""What a run's process left behind, read by the host without trusting it: result.json and
the artifacts (secrets redacted from their names and from text contents)."""

from __future__ import annotations

import mimetypes
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from floom import invisible, jsonvalues
from floom.engine.safefiles import (
    BIDI,
    CONTROL,
    Bounds,
    Cancelled,
    Refused,
    read_regular,
    said,
    walk,
)
from floom.services.access.secrets import Redactor
from floom.services.runs import artifact_scan

Artifact = tuple[str, bytes, str]

RESULT_FILE = "result.json"
# Collection gets the rest of the run's timeout, but at least this long after the run.
COLLECT_MIN_SECONDS = 5.0
MAX_ARTIFACT_FILES = 1000
MAX_NAME_CHARS = 512  # artifacts.name
TEXT_SNIFF_BYTES = 1024


def read_result(workdir: Path, *, limit: int) -> tuple[dict[str, Any], str | None]:
    """result.json as the script left it: ({}, None) when there is none, else the report or a
    problem that fails the run."""
    try:
        data = read_regular(workdir, RESULT_FILE, limit=limit, setting="FLOOM_MAX_RESULT_BYTES")
    except FileNotFoundError:
        return {}, None
    except Refused as exc:
        return {}, exc.message
    except OSError as exc:
        return {}, f"result.json could not be read: {exc.strerror}"
    report, breach = jsonvalues.parse(data, where="result.json", max_bytes=None)
    if breach is not None:
        if breach.limit == "json":
            return {}, breach.message
        return {}, f"{breach.message} ({breach.limit} bound): {jsonvalues.bounds_hint()}"
    if not isinstance(report, dict):
        return {}, 'result.json must be an object like {"outputs": {...}}'
    if "outputs" in report and not isinstance(report["outputs"], dict):
        return {}, 'result.json "outputs" must be an object of output names to values'
    return report, None


def is_text(data: bytes) -> bool:
    """Text is valid UTF-8 without a NUL in its first KiB; anything else is binary."""
    if b"\0" in data[:TEXT_SNIFF_BYTES]:
        return False
    try:
        data.decode("utf-8")
    except UnicodeDecodeError:
        return False
    return True


@dataclass
class Collected:
    artifacts: list[Artifact] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    cancelled: bool = False


def collect_artifacts(
    output_dir: Path, *, limit: int, bounds: Bounds, redactor: Redactor
) -> Collected:
    """The regular files under output_dir as artifacts, at most `limit` bytes in all (checked
    by size before reading), secrets redacted from names and from text contents."""
    done = Collected()
    try:
        found = walk(output_dir, bounds)
    except Cancelled:
        done.cancelled = True
        return done
    done.notes += found.notes
    total = 0
    names: set[str] = set()
    for rel, size in found.files:
        if bounds.should_cancel():
            done.cancelled = True
            return done
        if time.monotonic() > bounds.deadline:
            done.notes.append("floom stopped collecting artifacts at the run's time limit")
            break
        name = redactor.text(rel)
        if total + size > limit:
            done.notes.append(
                f"artifact {said(name)} ({size} bytes) was not kept: a run keeps up to {limit} "
                "bytes of artifacts (FLOOM_MAX_ARTIFACT_BYTES)"
            )
            continue
        if len(done.artifacts) >= MAX_ARTIFACT_FILES:
            done.notes.append(f"only the first {MAX_ARTIFACT_FILES} artifacts were kept")
            break
        if problem := _name_problem(name):
            done.notes.append(f"artifact {said(name[:MAX_NAME_CHARS])} was not kept: {problem}")
            continue
        try:
            data = read_regular(
                output_dir, rel, limit=limit - total, setting="FLOOM_MAX_ARTIFACT_BYTES"
            )
        except Refused as exc:
            done.notes.append(f"artifact not kept: {redactor.text(exc.message)}")
            continue
        except OSError as exc:
            done.notes.append(f"artifact {said(name)} could not be read: {exc.strerror}")
            continue
        total += len(data)
        name = _unique(name, names)
        content_type = mimetypes.guess_type(name)[0] or "application/octet-stream"
        data, content_type = _scanned(data, name, content_type, redactor, done.notes)
        done.artifacts.append((name, data, content_type))
    return done


def _scanned(
    data: bytes, name: str, content_type: str, redactor: Redactor, notes: list[str]
) -> tuple[bytes, str]:
    """The artifact's bytes with every secret masked in each encoding it may be written in,
    and the content type to record: a compressed or encrypted file floom cannot look inside
    is recorded as what it is, which marks it unscannable (served to run keys only)."""
    unscannable = artifact_scan.unscannable_kind(data)
    if unscannable is not None:
        kind, detected = unscannable
        notes.append(
            f"artifact {said(name)} is {kind} data floom cannot scan for secrets: only keys "
            "with the run scope may read it"
        )
        return data, detected
    if not artifact_scan.scanned(content_type):
        content_type = "application/octet-stream"  # named like an archive, but it is not one
    if not redactor.values:
        return data, content_type
    if is_text(data):
        data = redactor.text(data.decode("utf-8")).encode("utf-8")
    return artifact_scan.mask_bytes(data, redactor.values), content_type


def _name_problem(name: str) -> str | None:
    """Why `name` cannot name an artifact, or None: it is stored, put in links and in the
    download's Content-Disposition header, and printed."""
    if len(name) > MAX_NAME_CHARS:
        return f"its name is longer than {MAX_NAME_CHARS} characters"
    try:
        name.encode("utf-8")
    except UnicodeEncodeError:
        return "its name is not UTF-8"
    if found := BIDI.search(name):
        code = ord(found.group())
        return (
            f"its name holds {invisible.describe(code)} (U+{code:04X}), so it shows as "
            "another name; rename the file"
        )
    if CONTROL.search(name):
        return (
            "its name holds a control character (a newline, a tab, a terminal escape, ...), "
            "which no link or download can carry; rename the file"
        )
    return None


def _unique(name: str, taken: set[str]) -> str:
    # Two names can become one once a secret in them is redacted.
    candidate, n = name, 1
    while candidate in taken:
        n += 1
        candidate = f"{name}~{n}"
    taken.add(candidate)
    return candidate
