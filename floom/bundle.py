"""Worker folders as archives: packing, safe unpacking, and the content digest of a version."""

from __future__ import annotations

import bz2
import errno
import gzip
import hashlib
import io
import lzma
import os
import stat
import tarfile
import unicodedata
import zlib
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path, PurePosixPath

from floom import invisible
from floom.errors import BundleInvalid, BundlePathInvalid, BundleTooLarge, PayloadTooLarge
from floom.hints import Hint, Told, act, told

IGNORED_DIRS = frozenset({".git", "__pycache__", ".venv", "node_modules", ".mypy_cache"})
# Environment files hold secrets more often than not, and a version's files are readable by
# any read key and sit in every run's sandbox: a folder's are left behind, and said so.
# Their templates (`.env.example`) ship.
_ENV_TEMPLATES = (".example", ".sample", ".template", ".dist")
MAX_FILES = 2000
# Every entry counts toward this, directories and skipped ones too: reading 200k empty
# directory entries of a 0.4 MB upload cost seconds before they were counted.
MAX_ENTRIES = 2 * MAX_FILES
# What Linux file systems accept; longer names would fail when a run unpacks the version.
MAX_PATH_BYTES = 1024
MAX_NAME_BYTES = 255
# What an entry may add to the unpacked tar besides its contents (header, long-name records,
# padding): unpacking stops past max_bytes plus this for every entry allowed.
ENTRY_OVERHEAD = 4096
DEPLOY = act("deploy", folder="FOLDER")
_SHOWN = invisible.escapes(invisible.CONTROLS | invisible.UNSHOWN)


def _hint(first: str) -> Hint:
    return told(f"{first}; pack the worker folder with ", DEPLOY)


@dataclass(frozen=True)
class BundleFile:
    path: str
    data: bytes
    executable: bool = False


@dataclass(frozen=True)
class Bundle:
    """The files of one worker version, keyed by relative POSIX path."""

    files: dict[str, BundleFile]
    # What a folder held that was not shipped, each with why (`read_folder`).
    left_out: tuple[Told, ...] = ()

    @property
    def digest(self) -> str:
        """sha256 over paths, exec bits and contents: equal folders give equal digests."""
        h = hashlib.sha256()
        for path in sorted(self.files):
            f = self.files[path]
            h.update(path.encode())
            h.update(b"\0x" if f.executable else b"\0-")
            h.update(hashlib.sha256(f.data).digest())
        return h.hexdigest()

    def to_archive(self) -> bytes:
        """A normalised tar.gz: sorted entries, zero times and owners, so it is reproducible."""
        raw = io.BytesIO()
        with tarfile.open(fileobj=raw, mode="w", format=tarfile.PAX_FORMAT) as tar:
            for path in sorted(self.files):
                f = self.files[path]
                info = tarfile.TarInfo(path)
                info.size = len(f.data)
                info.mode = 0o755 if f.executable else 0o644
                info.mtime = 0
                tar.addfile(info, io.BytesIO(f.data))
        out = io.BytesIO()
        import gzip

        with gzip.GzipFile(fileobj=out, mode="wb", mtime=0) as gz:
            gz.write(raw.getvalue())
        return out.getvalue()

    def write_to(self, target: Path) -> None:
        for path, f in self.files.items():
            dest = target / path
            dest.parent.mkdir(parents=True, exist_ok=True)
            dest.write_bytes(f.data)
            dest.chmod(0o755 if f.executable else 0o644)


def _is_the_folder_itself(name: str) -> bool:
    return name != "" and not PurePosixPath(name).is_absolute() and not PurePosixPath(name).parts


def _check_path(name: str) -> str:
    p = PurePosixPath(name)
    if p.is_absolute() or ".." in p.parts or not p.parts:
        raise BundleInvalid(
            f"archive entry '{name}' points outside the worker folder",
            hint="the archive is a tar.gz of the worker folder's contents, each entry a path "
            "inside it (worker.yml at the top, no leading '/' and no '..'), as "
            "`tar czf worker.tgz -C FOLDER .` makes it",
        )
    path = str(p)
    try:
        size = len(path.encode("utf-8"))
    except UnicodeEncodeError:
        raise BundlePathInvalid(
            f"archive entry {path!r} is not a UTF-8 name", hint=_hint("rename the file")
        ) from None
    if size > MAX_PATH_BYTES:
        raise BundlePathInvalid(
            f"archive entry '{path[:80]}...' has a path of {size} bytes; at most "
            f"{MAX_PATH_BYTES} are accepted",
            hint="use shorter folder and file names",
            details={"limit": "path_bytes", "max": MAX_PATH_BYTES},
        )
    found = invisible.NOT_IN_NAMES.search(path)
    if found:
        # A file named "ru\u200bn.py" lists as "run.py", "a\u202eyp.exe" as "aexe.py": a
        # version's files, like a run's artifacts, must show as what they are.
        shown = path.translate(_SHOWN)
        raise BundlePathInvalid(
            f"archive entry '{shown[:120]}' holds {invisible.describe(ord(found.group()))}",
            hint=_hint("rename the file"),
        )
    for part in p.parts:
        if len(part.encode("utf-8")) > MAX_NAME_BYTES:
            raise BundlePathInvalid(
                f"archive entry '{path[:80]}...' has a name longer than {MAX_NAME_BYTES} bytes",
                hint="use shorter folder and file names",
                details={"limit": "name_bytes", "max": MAX_NAME_BYTES},
            )
    return path


def _check_entries(count: int) -> None:
    if count > MAX_ENTRIES:
        raise BundleTooLarge(
            f"the archive has more than {MAX_ENTRIES} entries (files and directories)",
            hint=_hint("keep data, caches and .git out of the worker folder"),
            details={"limit": "entries", "max": MAX_ENTRIES},
        )


def check_shown_apart(seen: dict[str, str], path: str) -> None:
    """Refuse `path` when it differs from a path in `seen` only in Unicode form (equal under
    NFKC): 'café' composed and decomposed, 'run.py' in fullwidth letters and in ASCII, 'a/b'
    with a fullwidth solidus and a real one, are two files on disk that every listing and
    diff of the version shows as one (names that differ in case stay apart: they show
    apart). `seen` maps each form to the first path in it."""
    form = unicodedata.normalize("NFKC", path)
    first = seen.setdefault(form, path)
    if first != path:
        raise BundlePathInvalid(
            f"{first!a} and {path!a} are two names that show as one ('{form}'): "
            "they differ only in Unicode form",
            hint=_hint("rename one of them (or save both in one form, NFC)"),
        )


@dataclass
class _Names:
    """The paths of one archive so far: each at most once, and never a file where another
    entry needs a directory (`a` and `a/b`), which would fail whenever a run unpacks it.
    With `forms` (an upload), never two that show as one either (check_shown_apart)."""

    files: set[str] = field(default_factory=set)
    dirs: set[str] = field(default_factory=set)
    forms: dict[str, str] | None = None

    def add_file(self, path: str) -> None:
        if path in self.files:
            raise BundlePathInvalid(
                f"archive entry '{path}' appears twice", hint=_hint("give each file once")
            )
        if path in self.dirs:
            raise _clash(path)
        self._add_parents(path)
        self._add_form(path)
        self.files.add(path)

    def add_dir(self, path: str) -> None:
        if path in self.files:
            raise _clash(path)
        self._add_parents(path)
        self._add_form(path)
        self.dirs.add(path)

    def _add_parents(self, path: str) -> None:
        for parent in PurePosixPath(path).parents[:-1]:
            name = str(parent)
            if name in self.files:
                raise _clash(name)
            self._add_form(name)
            self.dirs.add(name)

    def _add_form(self, path: str) -> None:
        if self.forms is not None:
            check_shown_apart(self.forms, path)


def _clash(path: str) -> BundlePathInvalid:
    return BundlePathInvalid(
        f"archive entry '{path}' is both a file and a directory",
        hint=_hint("rename the file or the folder"),
    )


def read_folder(folder: Path, *, max_bytes: int) -> Bundle:
    """Read a worker folder from disk: its regular files, never through a link (a link is
    refused), skipping caches and VCS folders unwalked; environment files and what is not a
    file (FIFOs, sockets, devices) are left out and named in `left_out`."""
    if not folder.is_dir():
        raise BundleInvalid(
            f"'{folder}' is not a folder", hint="pass the path of a folder holding worker.yml"
        )
    files: dict[str, BundleFile] = {}
    left_out: list[Told] = []
    forms: dict[str, str] = {}
    total = 0
    for rel, mode in folder_entries(folder):
        _check_path(rel)
        check_shown_apart(forms, rel)
        if stat.S_ISLNK(mode):
            raise BundleInvalid(
                f"'{rel}' is a symlink; workers cannot ship symlinks",
                hint="replace the link with the file it points to",
            )
        if stat.S_ISDIR(mode):
            continue
        if not stat.S_ISREG(mode):
            left_out.append(told(f"'{rel}' ({_kind(mode)}, not a regular file)"))
            continue
        if is_env_file(rel):
            left_out.append(_env_file_left_out(rel))
            continue
        path = folder / rel
        data, mode = _read_file(path, rel, count=len(files) + 1, total=total, max_bytes=max_bytes)
        total += len(data)
        files[rel] = BundleFile(rel, data, bool(mode & 0o111))
    return Bundle(files, left_out=tuple(left_out))


def _env_file_left_out(rel: str) -> Told:
    return told(
        f"'{rel}' (an environment file: store its secrets with ",
        act("secrets set", name="NAME"),
        " and declare them under `secrets:` in worker.yml)",
    )


def is_env_file(rel: str) -> bool:
    """Whether a folder's file is an environment file floom does not ship (`.env`,
    `.env.production`; not `.env.example`)."""
    name = PurePosixPath(rel).name
    return name == ".env" or (name.startswith(".env.") and not name.endswith(_ENV_TEMPLATES))


def folder_entries(folder: Path) -> Iterator[tuple[str, int]]:
    """(relative POSIX path, lstat mode) of each entry under a worker folder, folders before
    what they hold, sorted within each; never through a link, never into IGNORED_DIRS.
    Raises BundleTooLarge at the first entry past MAX_ENTRIES, counted as listed: a huge
    tree (a home folder, a data dump) costs no more than the bound to refuse."""
    count = 0
    pending = [""]
    while pending:
        rel_dir = pending.pop()
        listed: list[tuple[str, int]] = []
        with os.scandir(folder / rel_dir if rel_dir else folder) as it:
            for entry in it:
                if entry.name in IGNORED_DIRS and entry.is_dir(follow_symlinks=False):
                    continue
                count += 1
                _check_entries(count)
                rel = f"{rel_dir}/{entry.name}" if rel_dir else entry.name
                listed.append((rel, entry.stat(follow_symlinks=False).st_mode))
        listed.sort()
        yield from listed
        pending.extend(rel for rel, mode in reversed(listed) if stat.S_ISDIR(mode))


def read_folder_file(folder: Path, rel: str, *, limit: int) -> bytes:
    """One regular file of a worker folder, read up to `limit` + 1 bytes (a longer answer is
    the caller's to refuse: a procfs file says size 0). Never through a link, and a FIFO is
    not waited on. Raises FileNotFoundError when there is none, BundleInvalid naming what it
    is otherwise."""
    try:
        fd = os.open(folder / rel, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_NOCTTY)
    except OSError as exc:
        if exc.errno == errno.ELOOP:
            raise BundleInvalid(
                f"{rel} is a symlink; floom reads no link",
                hint=f"replace the link with the file it points to, inside {folder}",
            ) from None
        if exc.errno == errno.ENOENT:
            raise
        raise BundleInvalid(f"{rel} could not be read: {exc.strerror}") from None
    with open(fd, "rb") as f:
        mode = os.fstat(fd).st_mode
        if not stat.S_ISREG(mode):
            raise BundleInvalid(
                f"{rel} is {_kind(mode)}, not a regular file",
                hint=f"make {rel} a plain file",
            )
        return f.read(limit + 1)


def _kind(mode: int) -> str:
    for check, kind in (
        (stat.S_ISDIR, "a folder"),
        (stat.S_ISFIFO, "a FIFO"),
        (stat.S_ISSOCK, "a socket"),
        (stat.S_ISCHR, "a device"),
        (stat.S_ISBLK, "a device"),
        (stat.S_ISLNK, "a symlink"),
    ):
        if check(mode):
            return kind
    return "not a file"


def _read_file(
    path: Path, rel: str, *, count: int, total: int, max_bytes: int
) -> tuple[bytes, int]:
    """One file of a folder, opened without following a link swapped in since it was
    listed. Its size is checked before a byte is read and the read stops one byte past what
    the bundle has left, so a huge or growing file costs no more than the bundle's limit."""
    try:
        with open(os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK), "rb") as f:
            mode = os.fstat(f.fileno()).st_mode
            if not stat.S_ISREG(mode):  # swapped in since it was listed
                raise OSError(errno.EINVAL, f"it became {_kind(mode)}")
            _check_limits(count, total + os.fstat(f.fileno()).st_size, max_bytes)
            data = f.read(max_bytes - total + 1)
    except OSError as exc:
        raise BundleInvalid(
            f"'{rel}' could not be read: {exc.strerror}",
            hint="make the file readable, or move it out of the worker folder",
        ) from None
    _check_limits(count, total + len(data), max_bytes)
    return data, mode


def _check_limits(count: int, total: int, max_bytes: int) -> None:
    if count > MAX_FILES:
        raise BundleInvalid(
            f"the worker has more than {MAX_FILES} files",
            hint="keep data out of the worker folder; fetch it at run time",
        )
    if total > max_bytes:
        raise BundleInvalid(
            f"the worker is larger than {max_bytes // (1024 * 1024)} MiB",
            hint="remove large files from the folder or raise FLOOM_MAX_BUNDLE_BYTES",
        )


def read_archive(data: bytes, *, max_bytes: int) -> Bundle:
    """Unpack a tar archive (plain, gzip, bzip2 or xz) safely: regular files only, relative
    paths of sane length that do not clash, a bounded number of entries and bytes.

    Every limit is checked on an entry's header before its contents are read, and the
    archive is unpacked as a stream that stops past what those limits allow, so the work
    never scales with what an upload claims beyond them."""
    return _unpack(data, max_bytes=max_bytes, upload=False)


def read_upload(data: bytes, *, max_bytes: int) -> Bundle:
    """An archive sent to become a version (a REST deploy, MCP `files`), read as
    `read_archive` does, less what `read_folder` leaves out of a folder: environment files
    (`.env`, `sub/.env.local`; not `.env.example`) and FIFOs and devices, each named in
    `left_out`. So the version holds the same files whichever surface sent them."""
    return _unpack(data, max_bytes=max_bytes, upload=True)


def _unpack(data: bytes, *, max_bytes: int, upload: bool) -> Bundle:
    files: dict[str, BundleFile] = {}
    left_out: list[Told] = []
    names = _Names(forms={} if upload else None)
    total = entries = 0
    unpacked = BoundedReader(
        _decompressed(data),
        limit=max_bytes + MAX_ENTRIES * ENTRY_OVERHEAD,
        too_large=_upload_too_large,
    )
    try:
        with tarfile.open(fileobj=unpacked, mode="r|") as tar:
            for member in tar:
                entries += 1
                _check_entries(entries)
                if member.isdir() and _is_the_folder_itself(member.name):
                    continue  # `tar -C FOLDER .` starts with the folder as "." or "./"
                path = _check_path(member.name)
                if any(part in IGNORED_DIRS for part in PurePosixPath(path).parts):
                    continue
                if member.isdir():
                    names.add_dir(path)
                    continue
                if upload and (member.isfifo() or member.isdev()):
                    names.add_file(path)
                    kind = "a FIFO" if member.isfifo() else "a device"
                    left_out.append(told(f"'{path}' ({kind}, not a regular file)"))
                    continue
                if not member.isfile():
                    raise BundleInvalid(
                        f"archive entry '{member.name}' is not a regular file",
                        hint="workers may hold regular files only: replace the link with "
                        "the file it points to",
                    )
                names.add_file(path)
                if upload and is_env_file(path):
                    left_out.append(_env_file_left_out(path))
                    continue
                total += member.size
                _check_limits(len(files) + 1, total, max_bytes)
                extracted = tar.extractfile(member)
                content = extracted.read() if extracted else b""
                files[path] = BundleFile(path, content, bool(member.mode & 0o111))
    except (tarfile.TarError, EOFError, OSError, zlib.error, lzma.LZMAError) as exc:
        raise BundleInvalid(
            "the upload is not a readable tar.gz archive",
            hint=told("deploy with ", DEPLOY, ", which packs the folder for you"),
        ) from exc
    if not files and not left_out:
        raise BundleInvalid("the archive is empty", hint="the worker folder needs worker.yml")
    return Bundle(files, left_out=tuple(left_out))


def _decompressed(data: bytes) -> io.BufferedIOBase:
    raw = io.BytesIO(data)
    if data.startswith(b"\x1f\x8b"):
        return gzip.GzipFile(fileobj=raw, mode="rb")
    if data.startswith(b"BZh"):
        return bz2.BZ2File(raw, mode="rb")
    if data.startswith(b"\xfd7zXZ\x00"):
        return lzma.LZMAFile(raw, mode="rb")
    return raw


class UnpackedTooLarge(PayloadTooLarge):
    """A stream read through BoundedReader went past its limit."""

    def __init__(self, limit: int) -> None:
        super().__init__(f"more than {limit} bytes unpacked")
        self.limit = limit


class BoundedReader(io.RawIOBase):
    """A read-only stream that refuses to yield more than `limit` bytes of `inner` (raising
    `too_large(limit)`, UnpackedTooLarge by default): a small archive can unpack to
    gigabytes, and tarfile reads long-name and PAX records whole, whatever size they claim.
    For every archive floom unpacks (an upload, the files coming back from a sandbox)."""

    def __init__(
        self,
        inner: io.BufferedIOBase,
        *,
        limit: int,
        too_large: Callable[[int], Exception] = UnpackedTooLarge,
    ) -> None:
        self.inner = inner
        self.limit = self.left = limit
        self.too_large = too_large

    def readable(self) -> bool:
        return True

    def readinto(self, buffer: bytearray | memoryview) -> int:  # type: ignore[override]
        view = memoryview(buffer)
        chunk = self.inner.read(min(len(view), self.left + 1))
        if len(chunk) > self.left:
            raise self.too_large(self.limit)
        self.left -= len(chunk)
        view[: len(chunk)] = chunk
        return len(chunk)


def _upload_too_large(limit: int) -> BundleTooLarge:
    return BundleTooLarge(
        "the archive unpacks to more than its files and their headers could need",
        hint=told("deploy with ", DEPLOY, ", which packs the folder for you"),
        details={"limit": "unpacked_bytes", "max": limit},
    )
