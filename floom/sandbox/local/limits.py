"""One run's resource limits, enforced on its whole process tree while it runs.

Memory, process count and CPU go through the run's cgroup (floom/sandbox/local/cgroups.py).
Disk has no cgroup: a run dir with a disk of its own (floom/sandbox/local/disks.py) is bounded by
the kernel, and the supervisor ends the run once it finds the disk full; without one,
RLIMIT_FSIZE caps each file, and the supervisor polls the allocated size of the run's work
and output directories, ending the run once it reaches the limit.
"""

from __future__ import annotations

import os
import stat
from pathlib import Path
from typing import Final, NamedTuple

from floom.sandbox.base import SandboxSpec
from floom.sandbox.local import cgroups
from floom.sandbox.local.disks import RunDisk

MEMORY: Final = cgroups.MEMORY
PROCESSES: Final = cgroups.PROCESSES
CPU: Final = cgroups.CPU
DISK: Final = "disk"
FILES: Final = "files"
DEPTH: Final = "depth"
UNREADABLE: Final = "unreadable"
POLL_SECONDS: Final = 0.5
# A walk of the run's directories stops here; more entries than this end the run, since
# counting them every poll would cost the node more than the run is worth.
MAX_DISK_ENTRIES: Final = 100_000
# Folders nested deeper than this end the run too: the walk holds a descriptor per level.
MAX_DISK_DEPTH: Final = 256
_DIR_FLAGS: Final = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC


def limit_message(limit: str, spec: SandboxSpec) -> str:
    """The run's error when `limit` ended it, naming the manifest key that sets it."""
    if limit == MEMORY:
        return f"memory limit of {spec.memory_mb} MiB reached (limits.memory_mb in worker.yml)"
    if limit == PROCESSES:
        return f"process limit of {spec.processes} reached (limits.processes in worker.yml)"
    if limit == DISK:
        return f"disk limit of {spec.disk_mb} MiB reached (limits.disk_mb in worker.yml)"
    if limit == FILES:
        return (
            f"file limit of {MAX_DISK_ENTRIES} files and directories reached in the run's "
            "work and output dirs"
        )
    if limit == DEPTH:
        return (
            f"folders nested more than {MAX_DISK_DEPTH} deep in the run's work or output dir; "
            "floom counts a run's disk use only that far"
        )
    if limit == UNREADABLE:
        return (
            "a folder in the run's work or output dir was made unreadable; floom must read "
            "them all to count the run's disk use"
        )
    return f"{limit} limit reached"


class DiskUse(NamedTuple):
    """What a walk of a run's dirs found: the bytes allocated, and why it stopped short if it
    did (FILES, DEPTH or UNREADABLE: the run then ends, as floom cannot count its disk)."""

    bytes: int
    uncounted: str | None = None


class _Uncounted(Exception):
    """The walk stops: `limit` says why."""

    def __init__(self, limit: str) -> None:
        super().__init__(limit)
        self.limit = limit


def allocated_bytes(
    paths: tuple[Path, ...],
    *,
    max_entries: int = MAX_DISK_ENTRIES,
    max_depth: int = MAX_DISK_DEPTH,
) -> DiskUse:
    """Bytes allocated on disk under `paths` (from st_blocks, so sparse files count as what
    they hold). The walk stops short (`uncounted`) past `max_entries` entries or
    `max_depth` nested folders, or at a folder it may not read (a run under floom's own uid
    can take its own rights away, to hide what the folder holds). Each folder is opened
    from its parent's descriptor, never by its whole path (which a deep tree of long names
    would take past PATH_MAX, hiding what it holds); links are counted as themselves and
    never followed; entries that vanish mid-walk are skipped."""
    count = _Count(max_entries)
    try:
        for top in paths:
            _walk(top, count, max_depth)
    except _Uncounted as stop:
        return DiskUse(count.bytes, stop.limit)
    return DiskUse(count.bytes)


def _walk(top: Path, count: _Count, max_depth: int) -> None:
    """Count the tree `top` into `count`; raises _Uncounted."""
    try:
        fd = os.open(top, _DIR_FLAGS)
    except PermissionError as exc:
        raise _Uncounted(UNREADABLE) from exc
    except OSError:
        return
    # Each open folder, with its subfolders still to visit: a descriptor per level.
    frames: list[tuple[int, list[str]]] = [(fd, [])]
    try:
        frames[0][1].extend(count.folder(fd))
        while frames:
            parent, todo = frames[-1]
            if not todo:
                frames.pop()
                os.close(parent)
                continue
            try:
                child = os.open(todo.pop(), _DIR_FLAGS, dir_fd=parent)
            except PermissionError as exc:
                raise _Uncounted(UNREADABLE) from exc
            except OSError:
                continue  # gone meanwhile, or a link in its place
            frames.append((child, []))
            if len(frames) > max_depth + 1:  # the top itself is no level
                raise _Uncounted(DEPTH)
            frames[-1][1].extend(count.folder(child))
    finally:
        for open_fd, _ in frames:
            os.close(open_fd)


class _Count:
    """What allocated_bytes has counted so far."""

    def __init__(self, max_entries: int) -> None:
        self.max_entries = max_entries
        self.entries = 0
        self.bytes = 0

    def folder(self, fd: int) -> list[str]:
        """Count the entries of the folder open as `fd`; returns its subfolders' names."""
        subfolders: list[str] = []
        try:
            with os.scandir(fd) as entries:
                for entry in entries:
                    self.entries += 1
                    if self.entries > self.max_entries:
                        raise _Uncounted(FILES)
                    try:
                        found = entry.stat(follow_symlinks=False)
                    except PermissionError as exc:  # a folder it may list, not search
                        raise _Uncounted(UNREADABLE) from exc
                    except OSError:
                        continue
                    self.bytes += found.st_blocks * 512
                    if stat.S_ISDIR(found.st_mode):
                        subfolders.append(entry.name)
        except PermissionError as exc:
            raise _Uncounted(UNREADABLE) from exc
        except OSError:
            pass  # gone meanwhile
        return subfolders


class RunLimits:
    """The limits of one sandbox run: its cgroup while it exists, and its disk use."""

    def __init__(
        self, spec: SandboxSpec, cgroup: cgroups.RunCgroup | None, *, disk: RunDisk | None = None
    ) -> None:
        """Limit `cgroup` (the run's, created without limits; None where no hierarchy is
        usable) to the spec's memory, processes and CPU; raises CgroupError. `disk`: the
        run dir's own, which bounds its disk use (else it is polled)."""
        self.spec = spec
        self.disk = disk
        self.enforced = frozenset(cgroup.dirs) if cgroup is not None else frozenset()
        self.cgroup = cgroup
        if cgroup is not None:
            cgroup.configure(
                cgroups.CgroupLimits(
                    memory_bytes=spec.memory_mb * 1024 * 1024,
                    processes=spec.processes,
                    cpu_cores=spec.cpu,
                )
            )

    def shell_lines(self) -> str:
        """The launcher's shell lines that set the per-process limits before bubblewrap
        starts (setpriv and bwrap keep them for the sandbox): each file's size (without a
        disk of the run's own), no core files and, without a memory cgroup, the data
        segment. The shell's own `ulimit`, not an exec of prlimit: one process less on
        every run's path. Soft and hard alike, so
        nothing in the sandbox can raise them; a limit the shell cannot set ends the
        launcher with the shell's own error, before bubblewrap."""
        limits = ["ulimit -c 0"]
        if self.disk is None:
            # A disk of the run's own bounds what it allocates, not a sparse file's length.
            limits.append(f"ulimit -f {spec_disk_bytes(self.spec) // 512}")  # blocks
        if MEMORY not in self.enforced:
            # Without a memory cgroup, a per-process cap is the best there is (KiB).
            limits.append(f"ulimit -d {self.spec.memory_mb * 1024}")
        return " && ".join(limits) + " || exit 125\n"

    def reached(self) -> str | None:
        """The limit the run has reached, if any: memory, processes, then disk."""
        if self.cgroup is not None and (limit := self.cgroup.limit_reached()):
            return limit
        if self.disk is not None:
            return DISK if self.disk.full() else None
        used = allocated_bytes((self.spec.workdir, self.spec.output_dir))
        if used.uncounted is not None:
            return used.uncounted
        return DISK if used.bytes >= spec_disk_bytes(self.spec) else None

    def ended(self) -> None:
        """The run's tree has ended: its cgroup weighs nothing from now (RunCgroup.unweigh),
        while its removal (`close`) may come later."""
        if self.cgroup is not None:
            self.cgroup.unweigh()

    def close(self) -> bool:
        """Kill whatever is left of the run and remove its cgroup; False when a process of
        the run may be left (the cgroup stayed)."""
        if self.cgroup is None:
            return True
        removed = self.cgroup.remove()
        self.cgroup = None
        return removed


def spec_disk_bytes(spec: SandboxSpec) -> int:
    return spec.disk_mb * 1024 * 1024
