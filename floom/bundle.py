"""Worker folders as archives: packing, safe unpacking, and the content digest of a version."""

from __future__ import annotations

import hashlib
import io
import tarfile
from dataclasses import dataclass
from pathlib import Path, PurePosixPath

from floom.errors import BundleInvalid

IGNORED_DIRS = frozenset({".git", "__pycache__", ".venv", "node_modules", ".mypy_cache"})
MAX_FILES = 2000


@dataclass(frozen=True)
class BundleFile:
    path: str
    data: bytes
    executable: bool = False


@dataclass(frozen=True)
class Bundle:
    """The files of one worker version, keyed by relative POSIX path."""

    files: dict[str, BundleFile]

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

    def text(self, path: str) -> str | None:
        f = self.files.get(path)
        return None if f is None else f.data.decode("utf-8", errors="replace")

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


def _check_path(name: str) -> str:
    p = PurePosixPath(name)
    if p.is_absolute() or ".." in p.parts or not p.parts:
        raise BundleInvalid(
            f"archive entry '{name}' points outside the worker folder",
            hint="pack the worker folder with `floom deploy FOLDER`; entries must be relative",
        )
    return str(p)


def read_folder(folder: Path, *, max_bytes: int) -> Bundle:
    """Read a worker folder from disk, skipping caches and VCS folders."""
    if not folder.is_dir():
        raise BundleInvalid(
            f"'{folder}' is not a folder", hint="pass the path of a folder holding worker.yml"
        )
    files: dict[str, BundleFile] = {}
    total = 0
    for p in sorted(folder.rglob("*")):
        rel = p.relative_to(folder)
        if any(part in IGNORED_DIRS for part in rel.parts):
            continue
        if p.is_symlink():
            raise BundleInvalid(
                f"'{rel}' is a symlink; workers cannot ship symlinks",
                hint="replace the link with the file it points to",
            )
        if not p.is_file():
            continue
        data = p.read_bytes()
        total += len(data)
        _check_limits(len(files) + 1, total, max_bytes)
        files[rel.as_posix()] = BundleFile(rel.as_posix(), data, bool(p.stat().st_mode & 0o111))
    return Bundle(files)


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
    """Unpack a tar(.gz) archive safely: regular files only, relative paths, bounded size."""
    files: dict[str, BundleFile] = {}
    total = 0
    try:
        with tarfile.open(fileobj=io.BytesIO(data), mode="r:*") as tar:
            for member in tar:
                if member.isdir():
                    continue
                if not member.isfile():
                    raise BundleInvalid(
                        f"archive entry '{member.name}' is not a regular file",
                        hint="workers may hold regular files only (no links or devices)",
                    )
                path = _check_path(member.name)
                if any(part in IGNORED_DIRS for part in PurePosixPath(path).parts):
                    continue
                total += member.size
                _check_limits(len(files) + 1, total, max_bytes)
                extracted = tar.extractfile(member)
                content = extracted.read() if extracted else b""
                files[path] = BundleFile(path, content, bool(member.mode & 0o111))
    except (tarfile.TarError, EOFError, OSError) as exc:
        raise BundleInvalid(
            "the upload is not a readable tar.gz archive",
            hint="deploy with `floom deploy FOLDER`, which packs the folder for you",
        ) from exc
    if not files:
        raise BundleInvalid("the archive is empty", hint="the worker folder needs worker.yml")
    return Bundle(files)
