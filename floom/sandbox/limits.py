"""One run's resource limits, enforced on its whole process tree while it runs.

Memory, process count and CPU go through the run's cgroup (floom/sandbox/cgroups.py).
Disk has no cgroup: RLIMIT_FSIZE caps each file, and the supervisor polls the allocated
size of the run's work and output directories, ending the run once it reaches the limit.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Final

from floom.sandbox import cgroups
from floom.sandbox.base import SandboxSpec

MEMORY: Final = cgroups.MEMORY
PROCESSES: Final = cgroups.PROCESSES
CPU: Final = cgroups.CPU
DISK: Final = "disk"
FILES: Final = "files"
POLL_SECONDS: Final = 0.5
# A walk of the run's directories stops here; more entries than this end the run, since
# counting them every poll would cost the node more than the run is worth.
MAX_DISK_ENTRIES: Final = 100_000


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
    return f"{limit} limit reached"


def allocated_bytes(paths: tuple[Path, ...], *, max_entries: int = MAX_DISK_ENTRIES) -> int | None:
    """Bytes allocated on disk under `paths` (from st_blocks, so sparse files count as
    what they hold); None when there are more than `max_entries` entries. Links are
    counted as themselves and never followed; entries that vanish mid-walk are skipped."""
    total = 0
    entries = 0
    stack = [os.fspath(p) for p in paths]
    while stack:
        try:
            with os.scandir(stack.pop()) as it:
                for entry in it:
                    entries += 1
                    if entries > max_entries:
                        return None
                    try:
                        total += entry.stat(follow_symlinks=False).st_blocks * 512
                        if entry.is_dir(follow_symlinks=False):
                            stack.append(entry.path)
                    except OSError:
                        continue
        except OSError:
            continue
    return total


class RunLimits:
    """The limits of one sandbox run: its cgroup while it exists, and its disk use."""

    def __init__(self, spec: SandboxSpec, cgroup: cgroups.RunCgroup | None) -> None:
        """Limit `cgroup` (the run's, created without limits; None where no hierarchy is
        usable) to the spec's memory, processes and CPU; raises CgroupError."""
        self.spec = spec
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
        starts (setpriv and bwrap keep them for the sandbox): each file's size, no core
        files and, without a memory cgroup, the data segment. The shell's own `ulimit`, not
        an exec of prlimit: one process less on every run's path. Soft and hard alike, so
        nothing in the sandbox can raise them; a limit the shell cannot set ends the
        launcher with the shell's own error, before bubblewrap."""
        limits = ["ulimit -c 0", f"ulimit -f {spec_disk_bytes(self.spec) // 512}"]  # blocks
        if MEMORY not in self.enforced:
            # Without a memory cgroup, a per-process cap is the best there is (KiB).
            limits.append(f"ulimit -d {self.spec.memory_mb * 1024}")
        return " && ".join(limits) + " || exit 125\n"

    def reached(self) -> str | None:
        """The limit the run has reached, if any: memory, processes, then disk."""
        if self.cgroup is not None and (limit := self.cgroup.limit_reached()):
            return limit
        used = allocated_bytes((self.spec.workdir, self.spec.output_dir))
        if used is None:
            return FILES
        return DISK if used >= spec_disk_bytes(self.spec) else None

    def close(self) -> None:
        """Kill whatever is left of the run and remove its cgroup."""
        if self.cgroup is not None:
            self.cgroup.remove()
            self.cgroup = None


def spec_disk_bytes(spec: SandboxSpec) -> int:
    return spec.disk_mb * 1024 * 1024
