"""Each run's own filesystem of `disk_mb` MiB, so that the kernel bounds what a run writes.

A root floom gives each run dir a filesystem of its own: an ext4 image of exactly `disk_mb`
MiB under the work root, sparse (it takes on the host only what the run wrote), attached to
a loop device that goes with its last mount (LO_FLAGS_AUTOCLEAR), mounted at the run dir in
floom's namespace and, by its device, on the stage of the run's launcher. A write past it
fails with ENOSPC whatever the run tries (files unlinked while open, sparse files, hard
links, many small files, deep trees, the overlay's copy-ups): a run takes at most `disk_mb`
MiB of the host's disk, however it writes.

A disk never reaches the host's own disk unless it lives past writeback's time: its image
is attached while all holes (so the loop device's set-up has nothing to flush), the formatted
template's few hundred KiB are written in through the device, and the filesystem is mounted
`nobarrier` (nothing on it outlives the run), so nothing syncs the image; unlinked, its dirty
pages are dropped, with no blocks to free or discard on the host.

Attaching a loop device and mounting it cost 5-50 ms (the
loop device and the mount wait out RCU grace periods), so threads make disks ahead of the
runs, mounted detached (fsmount); a run dir gets one with a move_mount (0.03 ms). It is
unmounted detached when the run dir is let go (0.05 ms: floom still holds the mount), and
a thread closes it and removes its image. Up to MAKERS disks are made at once: each make
mostly waits in the kernel (a burst of warm runs kept one thread 94% busy on 1% of a core),
so makes side by side overlap their waits.
"""

from __future__ import annotations

import collections
import concurrent.futures
import contextlib
import ctypes
import errno
import fcntl
import functools
import logging
import os
import secrets
import shutil
import struct
import subprocess
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Final

log = logging.getLogger("floom.sandbox")

READY: Final = 2
"""Disks kept ready per size: one for a node that starts runs one after another, one more
for two at once."""
DELAY_SECONDS: Final = 0.1
"""How long the thread waits before it closes a disk let go of or makes one ahead (unless
the next run would have to make its own): a run's end is recorded and answered just after
its run dir is let go of, and the thread's system calls would trade the GIL with that."""
MAKERS: Final = 3
"""Disks made at once at most (each on a thread of its own; closing is on another)."""
KEPT_SIZES: Final = 2
"""Sizes disks are kept ready for: the most recently asked for."""
TEMPLATE_KEPT_BYTES: Final = 4 << 20
"""A template's data is kept in memory up to this size (a 1 GiB disk's is about 80 KiB)."""
TEMPLATES_KEPT: Final = 4
"""Templates whose data is kept in memory: the most recently read."""
DISKS_DIR: Final = ".disks"
"""The folder of the work root that holds the disks' images and templates."""
BYTES_PER_INODE: Final = 8192
"""A disk holds one file or folder per this many bytes of its size."""
FULL_BYTES: Final = 4 << 20
FULL_FRACTION: Final = 8
"""A disk counts as full with less than FULL_BYTES, or one FULL_FRACTIONth of its size,
free (whichever is less): a write the kernel refused with ENOSPC may leave up to a large
folio (2 MiB) free."""
MKFS_OPTIONS: Final = (
    # No journal (the disk lives as long as its run), nothing reserved for root, no resize
    # reserve; inode tables left unwritten (they read as zeros from the sparse image).
    *("-q", "-F", "-t", "ext4", "-O", "^has_journal,^resize_inode", "-m", "0", "-b", "4096"),
    *("-i", str(BYTES_PER_INODE), "-E", "lazy_itable_init=1,nodiscard"),
)
MS_NOSUID: Final = 0x2
MS_NODEV: Final = 0x4
_MOUNT_ATTR_NOSUID: Final = 0x2
_MOUNT_ATTR_NODEV: Final = 0x4

_LOOP_CTL_GET_FREE: Final = 0x4C82
_LOOP_CONFIGURE: Final = 0x4C0A
_LO_FLAGS_AUTOCLEAR: Final = 4
# The new mount API's system calls have one number on every architecture (since 5.1).
_SYS_MOVE_MOUNT: Final = 429
_SYS_FSOPEN: Final = 430
_SYS_FSCONFIG: Final = 431
_SYS_FSMOUNT: Final = 432
_FSCONFIG_SET_FLAG: Final = 0
_FSCONFIG_SET_STRING: Final = 1
_FSCONFIG_CMD_CREATE: Final = 6
_CLOEXEC: Final = 1  # FSOPEN_CLOEXEC, FSMOUNT_CLOEXEC
_MOVE_MOUNT_F_EMPTY_PATH: Final = 4
_AT_FDCWD: Final = -100
_MNT_DETACH: Final = 2


class _DiskUnavailable(OSError):
    """A disk could not be made: no loop devices, no mkfs.ext4, not root."""


@dataclass(eq=False)
class RunDisk:
    """One run's filesystem: `device` its loop device, `fd` its mount (detached until a run
    dir gets it), `image` its file on the host."""

    size_mb: int
    image: Path
    device: str
    fd: int

    def full(self) -> bool:
        """Whether the run has filled it: its free space (or its files) ran out."""
        if self.fd < 0:
            return False
        found = os.fstatvfs(self.fd)
        free = found.f_bavail * found.f_frsize
        size = found.f_blocks * found.f_frsize
        return free < min(FULL_BYTES, size // FULL_FRACTION) or found.f_favail == 0

    def close(self) -> None:
        """Let go of the mount (the filesystem and its loop device go with its last one) and
        remove the image."""
        if self.fd >= 0:
            os.close(self.fd)
            self.fd = -1
        with contextlib.suppress(OSError):
            os.unlink(self.image)


class Disks:
    """Run dirs with a disk each (`provide`, `release`), made ahead by a thread of its own
    started on first use, which also closes the disks let go of."""

    def __init__(self, *, ready: int = READY, makers: int = MAKERS) -> None:
        self._ready_count = ready
        self._makers = max(1, min(makers, ready))
        self._making: collections.Counter[tuple[Path, int]] = collections.Counter()
        self._pool: concurrent.futures.ThreadPoolExecutor | None = None
        self._changed = threading.Condition()
        self._ready: dict[tuple[Path, int], collections.deque[RunDisk]] = {}
        self._sizes: list[tuple[Path, int]] = []  # the sizes kept ready, newest last
        self._failed: set[tuple[Path, int]] = set()  # refilled only after the next take
        self._in_use: dict[str, RunDisk] = {}
        self._to_close: list[RunDisk] = []
        self._thread: threading.Thread | None = None
        self._closed = False
        # When the thread is to work next (monotonic), if it has work.
        self._due: float | None = None
        self.problem: str | None = None

    def usable(self) -> bool:
        """Whether disks can be made here: root, loop devices, mkfs.ext4, and the last try
        did not fail."""
        return self.problem is None and _prerequisites()

    def provide(self, base: Path, disk_mb: int) -> RunDisk | None:
        """Make the folder `base` (its parent made as needed) with a disk of `disk_mb` MiB
        mounted on it; None when no disk could be had (`base` is then a plain folder, and
        `problem` says why). Raises FileExistsError when `base` exists."""
        folder = base.parent / DISKS_DIR
        key = (Path(os.path.abspath(folder)), disk_mb)
        base.parent.mkdir(parents=True, exist_ok=True)
        base.mkdir()
        if not _prerequisites():
            self.problem = "disks need root, loop devices (/dev/loop-control) and mkfs.ext4"
            return None
        disk = self._take(key)
        try:
            if disk is None:
                disk = make_disk(key[0], disk_mb)
            _syscall(
                "move_mount",
                _SYS_MOVE_MOUNT,
                disk.fd,
                b"",
                _AT_FDCWD,
                os.fsencode(base),
                _MOVE_MOUNT_F_EMPTY_PATH,
            )
        except OSError as exc:
            if disk is not None:
                disk.close()
            if self.problem is None:
                log.warning("runs' disk use is polled, not enforced: %s", exc)
            self.problem = str(exc)
            return None
        self.problem = None
        with self._changed:
            self._in_use[os.path.abspath(base)] = disk
        return disk

    def disk_of(self, base: Path) -> RunDisk | None:
        """The disk mounted on `base` by `provide`, if any."""
        with self._changed:
            return self._in_use.get(os.path.abspath(base))

    def release(self, base: Path) -> None:
        """Unmount the disk of `base` (its files go with it; the empty folder stays) and
        have the thread close it. Never raises."""
        with self._changed:
            disk = self._in_use.pop(os.path.abspath(base), None)
        if disk is None:
            return
        if _libc().umount2(os.fsencode(base), _MNT_DETACH) != 0:
            log.warning("could not unmount %s: %s", base, os.strerror(ctypes.get_errno()))
        with self._changed:
            self._to_close.append(disk)
            if self._due is None:
                self._due = time.monotonic() + DELAY_SECONDS
                self._changed.notify()  # it sleeps until told (see _wake_for)
            self._start_thread()

    def close(self) -> None:
        """Close the disks kept ready; the thread ends once it closed those let go of."""
        with self._changed:
            self._closed = True
            ready = [disk for disks in self._ready.values() for disk in disks]
            self._ready.clear()
            self._changed.notify()
        for disk in ready:
            disk.close()

    def waiting(self, disk_mb: int) -> int:
        """How many disks of `disk_mb` MiB are ready now."""
        with self._changed:
            return sum(len(d) for (_, size), d in self._ready.items() if size == disk_mb)

    def _take(self, key: tuple[Path, int]) -> RunDisk | None:
        """A ready disk of `key`'s size, if any; the thread is asked to make more."""
        with self._changed:
            self._closed = False
            self._failed.discard(key)
            if key in self._sizes:
                self._sizes.remove(key)
            self._sizes.append(key)
            for old in self._sizes[:-KEPT_SIZES]:
                self._sizes.remove(old)
                self._to_close.extend(self._ready.pop(old, ()))
            ready = self._ready.get(key)
            disk = ready.popleft() if ready else None
            if not ready:
                self._wake_for(time.monotonic())  # the next run would make its own: now
            elif self._due is None:
                self._wake_for(time.monotonic() + DELAY_SECONDS)
            self._start_thread()
        return disk

    def _wake_for(self, due: float) -> None:
        """Have the thread work at `due` (under the lock). It is woken only when that is
        sooner than the time it sleeps towards (or it sleeps until told): a wake-up of a
        thread that then sleeps on to the same time cost each run's start and end a switch
        of threads and of the GIL."""
        if self._due is None or due < self._due:
            self._due = due
            self._changed.notify()

    def _start_thread(self) -> None:
        if self._thread is None or not self._thread.is_alive():
            self._thread = threading.Thread(target=self._serve, name="floom-disks", daemon=True)
            self._thread.start()

    def _wanted(self) -> tuple[Path, int] | None:
        """A size that lacks ready disks (under the lock)."""
        if self._closed:
            return None
        if self._making.total() >= self._makers:
            return None
        for key in reversed(self._sizes):
            made = len(self._ready.get(key, ())) + self._making[key]
            if key not in self._failed and made < self._ready_count:
                return key
        return None

    def _serve(self) -> None:
        while True:
            with self._changed:
                while True:
                    if not self._to_close and self._wanted() is None:
                        if self._closed:
                            self._thread = None
                            if self._pool is not None:
                                self._pool.shutdown(wait=False)  # makes in flight finish
                                self._pool = None
                            return
                        self._due = None
                        self._changed.wait()
                        continue
                    wait = 0.0 if self._due is None else self._due - time.monotonic()
                    if wait <= 0 or self._closed:
                        break
                    self._changed.wait(wait)
                closing, self._to_close = self._to_close, []
                while (key := self._wanted()) is not None:
                    self._making[key] += 1
                    if self._pool is None:
                        self._pool = concurrent.futures.ThreadPoolExecutor(
                            self._makers, thread_name_prefix="floom-disks-make"
                        )
                    self._pool.submit(self._make, key)
            for disk in closing:
                disk.close()

    def _make(self, key: tuple[Path, int]) -> None:
        """Make one disk of `key`'s size ahead (on a maker thread), counted in `_making`."""
        disk: RunDisk | None = None
        try:
            disk = make_disk(*key)
        except OSError as exc:
            log.debug("could not make a disk ahead: %s", exc)
        except BaseException:
            log.exception("could not make a disk ahead")
        with self._changed:
            self._making[key] -= 1
            if self._making[key] <= 0:
                del self._making[key]
            if disk is None:
                self._failed.add(key)
            elif key in self._sizes and not self._closed:
                self._ready.setdefault(key, collections.deque()).append(disk)
                disk = None
            self._changed.notify()  # the serving thread may want another made
        if disk is not None:
            disk.close()


def make_disk(folder: Path, disk_mb: int) -> RunDisk:
    """A disk of `disk_mb` MiB whose image is in `folder` (made as needed), mounted
    detached; raises OSError (_DiskUnavailable when a tool or device is missing)."""
    folder.mkdir(mode=0o700, exist_ok=True)
    template = _template(folder, disk_mb)
    image = folder / f"{secrets.token_hex(8)}.img"
    image_fd = os.open(
        image, os.O_RDWR | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600
    )
    try:
        try:
            os.ftruncate(image_fd, disk_mb << 20)
            # Attached while the image is all holes, the loop device has nothing to flush
            # (LOOP_CONFIGURE syncs its backing file); the template's blocks then go in
            # through the device, into the image's page cache only.
            number, device_fd = _attach(image_fd)
        finally:
            os.close(image_fd)
        try:
            _copy_into(template, device_fd)
            device = f"/dev/loop{number}"
            fd = _fsmount(device)
        finally:
            os.close(device_fd)  # the filesystem holds the device now
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(image)
        raise
    disk = RunDisk(disk_mb, image, device, fd)
    # The first folder made on a fresh filesystem reads its bitmaps in: here, not in a run.
    try:
        probe = f".probe-{secrets.token_hex(4)}"
        os.mkdir(probe, 0o700, dir_fd=fd)
        os.rmdir(probe, dir_fd=fd)
    except OSError:
        disk.close()
        raise
    return disk


def unmount_under(root: Path) -> int:
    """Unmount (detached) every mount below `root`, deepest first: the disks of runs a
    killed floom left mounted. Returns how many; raises nothing."""
    top = os.fsencode(os.path.realpath(root)) + b"/"
    try:
        with open("/proc/self/mountinfo", "rb") as f:
            points = [_unescape(line.split(b" ")[4]) for line in f]
    except OSError:
        return 0
    below = sorted({p for p in points if p.startswith(top)}, key=len, reverse=True)
    libc = _libc()
    return sum(1 for point in below if libc.umount2(point, _MNT_DETACH) == 0)


def _unescape(field: bytes) -> bytes:
    """A mountinfo path: spaces, tabs, newlines and backslashes are octal escapes there."""
    return field.decode("unicode_escape").encode("latin-1") if b"\\" in field else field


def _template(folder: Path, disk_mb: int) -> Path:
    """A formatted image of `disk_mb` MiB in `folder`, made once (mkfs.ext4)."""
    path = folder / f"template-{disk_mb}.img"
    if path.exists():
        return path
    mkfs = _mkfs()
    if mkfs is None:
        raise _DiskUnavailable(errno.ENOENT, "mkfs.ext4 is not on PATH (apt-get install e2fsprogs)")
    making = folder / f".template-{disk_mb}-{secrets.token_hex(4)}"
    try:
        fd = os.open(making, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600)
        try:
            os.ftruncate(fd, disk_mb << 20)
        finally:
            os.close(fd)
        done = subprocess.run(
            [mkfs, *MKFS_OPTIONS, os.fspath(making)],
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
            env={},
            check=False,
        )
        if done.returncode != 0:
            said = done.stderr.decode("utf-8", "replace").strip()
            raise _DiskUnavailable(errno.EIO, f"mkfs.ext4 failed: {said}")
        os.rename(making, path)
    finally:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(making)
    return path


def _copy_into(template: Path, device_fd: int) -> None:
    """Write the data of `template` (a formatted image: a few hundred KiB between holes) at
    the same offsets of the loop device `device_fd`, whose image is all holes. A template's
    data up to TEMPLATE_KEPT_BYTES is read once and kept: each disk then makes two dozen
    system calls fewer, each of which hands the GIL over while runs are being served."""
    found = os.stat(template)
    identity = (found.st_dev, found.st_ino, found.st_mtime_ns, found.st_size)
    with _templates_lock:
        kept = _templates.get(template)
    if kept is not None and kept[0] == identity:
        for offset, chunk in kept[1]:
            _write_all(device_fd, chunk, offset)
        return
    chunks: list[tuple[int, bytes]] | None = []
    kept_bytes = 0
    src = os.open(template, os.O_RDONLY | os.O_CLOEXEC)
    try:
        position = 0
        while position < found.st_size:
            try:
                start = os.lseek(src, position, os.SEEK_DATA)
            except OSError as exc:
                if exc.errno == errno.ENXIO:  # only a hole left
                    break
                raise
            end = os.lseek(src, start, os.SEEK_HOLE)
            offset = start
            while offset < end:
                chunk = os.pread(src, min(end - offset, 1 << 20), offset)
                if not chunk:
                    raise OSError(errno.EIO, f"{template} ended early")
                _write_all(device_fd, chunk, offset)
                kept_bytes += len(chunk)
                if chunks is not None and kept_bytes <= TEMPLATE_KEPT_BYTES:
                    chunks.append((offset, chunk))
                else:
                    chunks = None
                offset += len(chunk)
            position = end
    finally:
        os.close(src)
    if chunks is not None:
        with _templates_lock:
            _templates[template] = (identity, tuple(chunks))
            while len(_templates) > TEMPLATES_KEPT:
                del _templates[next(iter(_templates))]


def _write_all(fd: int, data: bytes, offset: int) -> None:
    view = memoryview(data)
    while view:
        written = os.pwrite(fd, view, offset)
        view = view[written:]
        offset += written


_templates: dict[Path, tuple[tuple[int, int, int, int], tuple[tuple[int, bytes], ...]]] = {}
_templates_lock = threading.Lock()


def _attach(image_fd: int) -> tuple[int, int]:
    """A free loop device backed by `image_fd`, cleared when its last user closes it; returns
    its number and a descriptor of it."""
    # struct loop_config: the backing fd, the block size (0: the default), a loop_info64
    # whose only field set is lo_flags, and reserved space.
    info = struct.pack(
        "=5Q4I64s64s32s2Q", 0, 0, 0, 0, 0, 0, 0, 0, _LO_FLAGS_AUTOCLEAR, b"", b"", b"", 0, 0
    )
    config = struct.pack("=II", image_fd, 0) + info + bytes(64)
    try:
        control = os.open("/dev/loop-control", os.O_RDWR | os.O_CLOEXEC)
    except OSError as exc:
        raise _DiskUnavailable(exc.errno, f"no loop devices: {exc.strerror}") from exc
    try:
        for _ in range(32):
            number = fcntl.ioctl(control, _LOOP_CTL_GET_FREE)
            device_fd = os.open(f"/dev/loop{number}", os.O_RDWR | os.O_CLOEXEC)
            try:
                fcntl.ioctl(device_fd, _LOOP_CONFIGURE, config)
            except OSError as exc:
                os.close(device_fd)
                if exc.errno == errno.EBUSY:  # another process took it meanwhile
                    continue
                raise
            return number, device_fd
    finally:
        os.close(control)
    raise _DiskUnavailable(errno.EBUSY, "no free loop device")


def _fsmount(device: str) -> int:
    """The ext4 filesystem on `device`, mounted detached (nosuid, nodev)."""
    fs = _syscall("fsopen", _SYS_FSOPEN, b"ext4", _CLOEXEC)
    try:
        source = os.fsencode(device)
        _syscall("fsconfig", _SYS_FSCONFIG, fs, _FSCONFIG_SET_STRING, b"source", source, 0)
        # The inode tables are never written: they read as zeros from the sparse image.
        _syscall("fsconfig", _SYS_FSCONFIG, fs, _FSCONFIG_SET_FLAG, b"noinit_itable", None, 0)
        # Nothing on a run's disk outlives its run, so it never asks for a flush: its image
        # stays in the host's page cache (until writeback's own time) and goes with it.
        _syscall("fsconfig", _SYS_FSCONFIG, fs, _FSCONFIG_SET_FLAG, b"nobarrier", None, 0)
        _syscall("fsconfig", _SYS_FSCONFIG, fs, _FSCONFIG_CMD_CREATE, None, None, 0)
        return _syscall(
            "fsmount", _SYS_FSMOUNT, fs, _CLOEXEC, _MOUNT_ATTR_NOSUID | _MOUNT_ATTR_NODEV
        )
    finally:
        os.close(fs)


def _syscall(name: str, number: int, *args: object) -> int:
    result = int(_libc().syscall(number, *args))
    if result < 0:
        code = ctypes.get_errno() or errno.EPERM
        raise OSError(code, f"{name}: {os.strerror(code)}")
    return result


_loaded: ctypes.CDLL | None = None


def _libc() -> ctypes.CDLL:
    global _loaded
    if _loaded is None:
        libc = ctypes.CDLL(None, use_errno=True)
        libc.syscall.restype = ctypes.c_long
        libc.umount2.argtypes = [ctypes.c_char_p, ctypes.c_int]
        _loaded = libc
    return _loaded


@functools.cache
def _prerequisites() -> bool:
    return os.geteuid() == 0 and os.path.exists("/dev/loop-control") and _mkfs() is not None


def _mkfs() -> str | None:
    return shutil.which("mkfs.ext4") or next(
        (p for p in ("/usr/sbin/mkfs.ext4", "/sbin/mkfs.ext4") if os.path.exists(p)), None
    )
