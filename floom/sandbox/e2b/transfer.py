"""Moving a run's files to a remote sandbox and back: one archive each way, and the archive
that comes back read as hostile (the process may have left anything in it)."""

from __future__ import annotations

import errno
import gzip
import io
import os
import shutil
import stat
import tarfile
import zlib
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from pathlib import Path, PurePosixPath
from typing import Final, Protocol

from floom.bundle import ENTRY_OVERHEAD, BoundedReader, UnpackedTooLarge
from floom.invisible import shown
from floom.sandbox.base import MAX_WALK_DEPTH, MAX_WALK_ENTRIES

# The host walk's bounds (sandbox/base.py), so a run's files come back alike from either
# backend: the most entries an archive from a sandbox may hold (the rest is dropped with a
# note), and the deepest a file may sit.
MAX_ENTRIES = MAX_WALK_ENTRIES
MAX_DEPTH = MAX_WALK_DEPTH
_NEW_FILE = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC

DECODED_PIECE: Final = 64 * 1024
"""The most bytes one step of decoding a download makes (decoded_body)."""

Snapshot = dict[str, tuple[int, int]]
"""What the host trees held when last synced: `work/x` -> (size, mtime_ns)."""


def pack(trees: dict[str, Path], *, since: Snapshot | None = None) -> tuple[bytes, Snapshot]:
    """A gzip tar of the regular files under each tree (as `<name>/<path>`), only those new
    or changed since `since` when given; and the snapshot of all of them now. The trees are
    floom's own (the version's files, inputs, what an earlier download left): links and
    special files are not carried."""
    now: Snapshot = {}
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w:gz", compresslevel=1) as tar:
        for name, root in trees.items():
            folder = tarfile.TarInfo(name)
            folder.type, folder.mode = tarfile.DIRTYPE, 0o755
            tar.addfile(folder)
            for path in _regular_files(root):
                rel = f"{name}/{path.relative_to(root).as_posix()}"
                st = path.stat(follow_symlinks=False)
                now[rel] = (st.st_size, st.st_mtime_ns)
                if since is not None and since.get(rel) == now[rel]:
                    continue
                info = tarfile.TarInfo(rel)
                info.size, info.mode = st.st_size, 0o755 if st.st_mode & 0o100 else 0o644
                with path.open("rb") as f:
                    tar.addfile(info, f)
    return buf.getvalue(), now


def snapshot(trees: dict[str, Path]) -> Snapshot:
    """The size and modification time of every regular file under the trees."""
    now: Snapshot = {}
    for name, root in trees.items():
        for path in _regular_files(root):
            st = path.stat(follow_symlinks=False)
            now[f"{name}/{path.relative_to(root).as_posix()}"] = (st.st_size, st.st_mtime_ns)
    return now


def changed(trees: dict[str, Path], since: Snapshot) -> bool:
    """Whether any regular file under the trees is new or changed since `since`."""
    now = snapshot(trees)
    return any(since.get(rel) != seen for rel, seen in now.items())


def _regular_files(root: Path) -> list[Path]:
    found: list[Path] = []
    for dirpath, dirnames, filenames in os.walk(root):
        dirnames[:] = [d for d in dirnames if not os.path.islink(os.path.join(dirpath, d))]
        for filename in filenames:
            path = Path(dirpath, filename)
            if stat.S_ISREG(path.lstat().st_mode):
                found.append(path)
    return sorted(found)


def decoded_body(encoding: str, raw: Iterable[bytes]) -> Iterator[bytes]:
    """The bytes of an HTTP body sent with Content-Encoding `encoding`, decoded DECODED_PIECE
    bytes at most at a time: a chunk of deflate from the wire unpacks to up to a thousand
    times its size (httpx decodes each chunk it reads whole, 8 KiB of it to 8 MiB, before its
    reader sees any). Only what floom's client asks for is read (none, gzip, deflate): any
    other encoding raises ValueError naming it."""
    named = [part.strip().lower() for part in encoding.split(",")]
    named = [part for part in named if part and part != "identity"]
    if not named:
        yield from raw
        return
    if named not in (["gzip"], ["deflate"]):
        raise ValueError(
            f"the file came in Content-Encoding {shown(encoding[:80])!r}, which floom did not "
            "ask for (it reads gzip, deflate or none)"
        )
    chunks = iter(raw)
    if named == ["gzip"]:
        decoder = zlib.decompressobj(16 + zlib.MAX_WBITS)
    else:
        # deflate is zlib-wrapped by the standard, bare from some servers: told apart by the
        # wrapper's two-byte header, as httpx does.
        head = b""
        for data in chunks:
            head += data
            if len(head) >= 2:
                break
        wrapped = len(head) >= 2 and head[0] & 0x0F == 8 and (head[0] << 8 | head[1]) % 31 == 0
        decoder = zlib.decompressobj(zlib.MAX_WBITS if wrapped else -zlib.MAX_WBITS)
        yield from _decode(decoder, head)
    for data in chunks:
        yield from _decode(decoder, data)


class _Decoder(Protocol):
    """A zlib decompression object (the standard library names its type only privately)."""

    @property
    def unconsumed_tail(self) -> bytes: ...

    def decompress(self, data: bytes, max_length: int = ..., /) -> bytes: ...


def _decode(decoder: _Decoder, data: bytes) -> Iterator[bytes]:
    while True:
        piece = decoder.decompress(data, DECODED_PIECE)
        data = decoder.unconsumed_tail
        if piece:
            yield piece
        if not data and len(piece) < DECODED_PIECE:
            return


@dataclass
class Unpacked:
    """What came back: the trees written (name -> fresh dir), and what was not kept."""

    trees: dict[str, Path] = field(default_factory=dict)
    notes: list[str] = field(default_factory=list)
    over_budget: bool = False


def unpack_hostile(data: bytes, *, into: Path, names: tuple[str, ...], budget: int) -> Unpacked:
    """Unpack a gzip tar made in a sandbox into fresh dirs `into/<name>` for each of `names`.

    Only regular files and folders under those names are written, each into a new file
    (never through a link: `into` is floom's own fresh dir and nothing in it is a link); at
    most `budget` bytes in all (by the sizes the headers declare, before reading) and
    MAX_ENTRIES entries. Anything else is left out with a note; a broken archive keeps what
    was written before the break. It is read as a stream that stops past what those bounds
    allow (the headers' share included): the sandbox may have made it anything, and tarfile
    reads a PAX or long-name record whole, whatever size it claims (300 KB of gzip claiming
    300 MB took 300 MB of floom's memory)."""
    done = Unpacked()
    shutil.rmtree(into, ignore_errors=True)
    into.mkdir(parents=True)
    for name in names:
        done.trees[name] = into / name
        done.trees[name].mkdir()
    total = entries = 0
    try:
        stream = BoundedReader(
            gzip.GzipFile(fileobj=io.BytesIO(data), mode="rb"),
            limit=budget + (MAX_ENTRIES + 1) * ENTRY_OVERHEAD,
        )
        with tarfile.open(fileobj=stream, mode="r|") as tar:
            for member in tar:
                entries += 1
                if entries > MAX_ENTRIES:
                    done.notes.append(f"only the first {MAX_ENTRIES} files came back")
                    break
                parts = _safe_parts(member.name)
                # Escaped: a newline or terminal escape in a name must not shape the log.
                named = shown(member.name[:200])
                if parts is None or parts[0] not in names:
                    done.notes.append(f"{named} was not kept: its path leaves the workspace")
                    continue
                if len(parts) > MAX_DEPTH:
                    done.notes.append(
                        f"{named} was not kept: it is nested deeper than {MAX_DEPTH} folders"
                    )
                    continue
                if member.isdir():
                    continue
                if len(parts) == 1:
                    # `work` or `output` itself, replaced in the sandbox by a file or a link:
                    # the tree stays the fresh folder, with what else came back in it.
                    done.notes.append(f"{named} was not kept: it is not a folder")
                    continue
                if not member.isfile():
                    done.notes.append(f"{named} was not kept: it is not a regular file")
                    continue
                if member.size < 0:
                    done.notes.append(f"{named} was not kept: its size is negative")
                    break
                total += member.size
                if total > budget:
                    done.over_budget = True
                    break
                source = tar.extractfile(member)
                if source is None:
                    continue
                content = source.read(member.size)
                try:
                    _write_new(into, parts, content, executable=member.mode & 0o100)
                except OSError as exc:
                    if exc.errno not in _UNWRITABLE_NAME:
                        raise  # the host's own trouble (a full disk): cut short, said so
                    # This one file cannot be written here (a name too long, a file where
                    # a folder came before): the rest still come back.
                    why = os.strerror(exc.errno or 0).lower()
                    done.notes.append(f"{named} was not kept: {why}")
    except UnpackedTooLarge:
        done.over_budget = True
    except (tarfile.TarError, EOFError, OSError, ValueError) as exc:
        done.notes.append(f"the files that came back were cut short: {shown(str(exc))}")
    return done


_UNWRITABLE_NAME: Final = frozenset(
    {errno.ENAMETOOLONG, errno.EEXIST, errno.ENOTDIR, errno.EISDIR, errno.EINVAL, errno.EILSEQ}
)
"""Errors writing one unpacked file that its name or the files before it caused."""


def _safe_parts(name: str) -> tuple[str, ...] | None:
    path = PurePosixPath(name)
    if path.is_absolute():
        return None
    parts = tuple(p for p in path.parts if p != ".")
    if not parts or any(p == ".." or "\0" in p for p in parts):
        return None
    return parts


def _write_new(root: Path, parts: tuple[str, ...], data: bytes, *, executable: int) -> None:
    folder = root.joinpath(*parts[:-1])
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / parts[-1]
    if path.exists() or path.is_symlink():
        path.unlink() if not path.is_dir() else shutil.rmtree(path)
    fd = os.open(path, _NEW_FILE, 0o755 if executable else 0o644)
    try:
        view = memoryview(data)
        while view:
            view = view[os.write(fd, view) :]
    finally:
        os.close(fd)


def replace_tree(target: Path, fresh: Path) -> None:
    """Put `fresh` where `target` is (the same path, new content); the old one goes."""
    old = target.with_name(f".{target.name}.old-{os.urandom(4).hex()}")
    target.rename(old)
    fresh.rename(target)
    shutil.rmtree(old, ignore_errors=True)


def move_file(source: Path, target: Path) -> None:
    """Move one unpacked file into an existing host dir, replacing whatever entry (a file or
    a link, never followed) has its name."""
    if target.is_dir() and not target.is_symlink():
        shutil.rmtree(target)
    os.replace(source, target)
