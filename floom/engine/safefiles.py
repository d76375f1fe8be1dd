"""Opening files in a run's work and output dirs from the host, where a worker's process may
have left anything: links, FIFOs, sockets, sparse or growing files, huge trees.

Every path is opened one component at a time from a directory fd with O_NOFOLLOW, so no link
is followed anywhere on the way; only regular files are read, their size is checked before
reading and the read stops one byte past the limit; walks use scandir without following
links and stop at an entry count, a deadline and a cancel.
"""

from __future__ import annotations

import errno
import os
import stat
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager, suppress
from dataclasses import dataclass, field
from pathlib import Path, PurePosixPath

from floom import invisible
from floom.errors import FloomError
from floom.sandbox.base import MAX_WALK_DEPTH, MAX_WALK_ENTRIES

_CHUNK = 1024 * 1024
_DIR_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC
# O_NONBLOCK: opening a FIFO that appeared since the lstat must not wait for a writer.
_READ_FLAGS = os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC | os.O_NOCTTY
_WRITE_FLAGS = os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC


class Refused(FloomError):
    """A file floom will not read or write; the message names the file and the rule."""

    status = 422
    code = "file_refused"

    def __init__(self, message: str) -> None:
        super().__init__(message)


class Cancelled(FloomError):
    """The run was cancelled while floom was collecting its files."""

    status = 409
    code = "collection_cancelled"


@dataclass(frozen=True)
class Bounds:
    """How far a walk may go: entries seen, a monotonic deadline, and a cancel check."""

    deadline: float
    should_cancel: Callable[[], bool] = lambda: False
    max_entries: int = MAX_WALK_ENTRIES


# Characters a name shows escaped in floom's words about it (C0, DEL, C1, and what
# reorders, breaks or hides text: floom/invisible.py).
CONTROL = invisible.pattern(invisible.CONTROLS | invisible.UNSHOWN)
# The invisible characters that reorder or hide text: a name holding one can pose as another
# ("invoice_\u202efdp.exe" shows as "invoice_exe.pdf", "rep\u200bort.pdf" as "report.pdf").
BIDI = invisible.pattern(invisible.REORDERING | invisible.ZERO_WIDTH)


def said(rel: str | Sequence[str]) -> str:
    """A path of a run's dirs as floom's notes and refusals say it (floom/invisible.py's
    `shown`): a newline or a terminal escape in a file's name neither breaks the record of
    the run's end nor shapes its log."""
    return invisible.shown(rel if isinstance(rel, str) else "/".join(rel))


def kind_of(mode: int) -> str:
    if stat.S_ISLNK(mode):
        return "a symlink"
    if stat.S_ISDIR(mode):
        return "a directory"
    if stat.S_ISFIFO(mode):
        return "a FIFO (named pipe)"
    if stat.S_ISSOCK(mode):
        return "a socket"
    if stat.S_ISCHR(mode) or stat.S_ISBLK(mode):
        return "a device"
    return "not a regular file"


def split(rel: str | Sequence[str]) -> tuple[str, ...]:
    parts = PurePosixPath(rel).parts if isinstance(rel, str) else tuple(rel)
    if not parts or any(p in ("", ".", "..", "/") or "/" in p or "\0" in p for p in parts):
        raise Refused(f"{said(parts) or '.'} is not a path inside the run's directory")
    return parts


@contextmanager
def _dir_fd(root: Path, parts: Sequence[str], *, create: bool = False) -> Iterator[int]:
    """An fd of root/parts, each component opened without following a link."""
    fd = os.open(root, _DIR_FLAGS)
    try:
        for i, part in enumerate(parts):
            try:
                if create:
                    with suppress(FileExistsError):
                        os.mkdir(part, 0o755, dir_fd=fd)
                nxt = os.open(part, _DIR_FLAGS, dir_fd=fd)
            except OSError as exc:
                if exc.errno in (errno.ELOOP, errno.ENOTDIR):
                    st = os.stat(part, dir_fd=fd, follow_symlinks=False)
                    shown = said(parts[: i + 1])
                    raise Refused(
                        f"{shown} is {kind_of(st.st_mode)}; floom does not follow it"
                    ) from exc
                raise
            os.close(fd)
            fd = nxt
        yield fd
    finally:
        os.close(fd)


@contextmanager
def open_regular(root: Path, rel: str | Sequence[str]) -> Iterator[tuple[int, os.stat_result]]:
    """Open root/rel for reading if it is a regular file reached without any link; yields the
    fd and its fstat. FileNotFoundError when it is not there, Refused when it is not safe."""
    parts = split(rel)
    shown = said(parts)
    with _dir_fd(root, parts[:-1]) as dfd:
        st = os.stat(parts[-1], dir_fd=dfd, follow_symlinks=False)
        if not stat.S_ISREG(st.st_mode):
            raise Refused(f"{shown} is {kind_of(st.st_mode)}; floom reads only regular files")
        try:
            fd = os.open(parts[-1], _READ_FLAGS, dir_fd=dfd)
        except OSError as exc:
            if exc.errno == errno.ELOOP:
                raise Refused(f"{shown} is a symlink; floom reads only regular files") from exc
            raise
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):  # swapped between the lstat and the open
            raise Refused(f"{shown} is {kind_of(st.st_mode)}; floom reads only regular files")
        yield fd, st
    finally:
        os.close(fd)


def read_fd(fd: int, limit: int) -> bytes:
    """At most limit + 1 bytes: one more than allowed tells a file that grew."""
    chunks: list[bytes] = []
    left = limit + 1
    while left > 0:
        chunk = os.read(fd, min(left, _CHUNK))
        if not chunk:
            break
        chunks.append(chunk)
        left -= len(chunk)
    return b"".join(chunks)


def read_regular(root: Path, rel: str | Sequence[str], *, limit: int, setting: str) -> bytes:
    """The bytes of root/rel, refused when over `limit` (by its size, before reading; sparse
    files count by their size) or not a regular file reached without links."""
    shown = said(split(rel))
    with open_regular(root, rel) as (fd, st):
        if st.st_size > limit:
            raise Refused(f"{shown} is {st.st_size} bytes, over the limit of {limit} ({setting})")
        data = read_fd(fd, limit)
    if len(data) > limit:
        raise Refused(f"{shown} grew past the limit of {limit} bytes while read ({setting})")
    return data


def write_regular(root: Path, rel: str | Sequence[str], data: bytes) -> None:
    """Write root/rel, creating its folders, never through a link or into anything but a
    regular file."""
    parts = split(rel)
    shown = said(parts)
    with _dir_fd(root, parts[:-1], create=True) as dfd:
        try:
            st = os.stat(parts[-1], dir_fd=dfd, follow_symlinks=False)
        except FileNotFoundError:
            pass
        else:
            if not stat.S_ISREG(st.st_mode):
                raise Refused(f"{shown} is {kind_of(st.st_mode)}; floom writes only regular files")
        try:
            fd = os.open(parts[-1], _WRITE_FLAGS, 0o644, dir_fd=dfd)
        except OSError as exc:
            if exc.errno in (errno.ELOOP, errno.ENXIO):
                raise Refused(f"{shown} is not a regular file; floom writes only those") from exc
            raise
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            raise Refused(f"{shown} is not a regular file; floom writes only those")
        view = memoryview(data)
        while view:
            view = view[os.write(fd, view) :]
    finally:
        os.close(fd)


@dataclass
class Walk:
    """What a bounded walk found: regular files (relative name, size), and lines saying what
    was passed over or why the walk stopped."""

    files: list[tuple[str, int]] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    complete: bool = True


def walk_below(root: Path, below: Sequence[str], bounds: Bounds) -> Walk:
    """Like walk, in the folder root/below (reached without links), names relative to it.
    FileNotFoundError, NotADirectoryError or Refused when that folder is not there."""
    if below:
        with _dir_fd(root, split(below)):
            pass
    return walk(root, bounds, below=tuple(below))


def walk(root: Path, bounds: Bounds, *, below: tuple[str, ...] = (), label: str = "") -> Walk:
    """The regular files under root, sorted, without following a link anywhere. Raises
    Cancelled when the run is cancelled meanwhile."""
    found = Walk()
    seen = 0
    stack: list[tuple[str, ...]] = [()]
    while stack:
        parts = stack.pop()
        try:
            with _dir_fd(root, (*below, *parts)) as fd, os.scandir(fd) as entries:
                for entry in entries:
                    seen += 1
                    if seen > bounds.max_entries:
                        found.notes.append(
                            f"{label}more than {bounds.max_entries} entries; floom stopped "
                            "looking there"
                        )
                        found.complete = False
                        return _sorted(found)
                    if seen % 64 == 0:
                        _check(bounds, found, label)
                        if not found.complete:
                            return _sorted(found)
                    rel = (*parts, entry.name)
                    shown = label + said(rel)
                    st = entry.stat(follow_symlinks=False)
                    if stat.S_ISDIR(st.st_mode):
                        if len(rel) >= MAX_WALK_DEPTH:
                            found.notes.append(
                                f"{shown} is nested deeper than {MAX_WALK_DEPTH} folders; "
                                "floom does not look inside"
                            )
                        else:
                            stack.append(rel)
                    elif stat.S_ISREG(st.st_mode):
                        found.files.append(("/".join(rel), st.st_size))
                    else:
                        found.notes.append(
                            f"{shown} is {kind_of(st.st_mode)}; floom keeps only regular files"
                        )
        except Refused as exc:
            found.notes.append(label + exc.message)
        except OSError as exc:
            found.notes.append(f"{label}{said(parts) or '.'} could not be read: {exc.strerror}")
    return _sorted(found)


def _check(bounds: Bounds, found: Walk, label: str) -> None:
    if bounds.should_cancel():
        raise Cancelled()
    if time.monotonic() > bounds.deadline:
        found.notes.append(f"{label}floom stopped collecting files at the run's time limit")
        found.complete = False


def _sorted(found: Walk) -> Walk:
    found.files.sort(key=lambda f: f[0].split("/"))
    return found
