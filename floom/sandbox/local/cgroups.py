"""Per-run control groups: memory, process count and CPU limits on a run's whole tree.

A run's cgroup lives under `floom/` inside the cgroup floom itself runs in, so runs stay
inside whatever the operator gave floom. cgroup v2 is used where its controllers are
available (as root, or in a delegated subtree whose `cgroup.subtree_control` offers them);
otherwise the v1 hierarchies of the `memory`, `pids` and `cpu` controllers.
"""

from __future__ import annotations

import contextlib
import errno
import functools
import os
import signal
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Final

from floom.errors import FloomError

MEMORY: Final = "memory"
PROCESSES: Final = "processes"
CPU: Final = "cpu"
LIMITS: Final = (MEMORY, PROCESSES, CPU)
# The kernel's name for each limit's controller.
_CONTROLLER: Final = {MEMORY: "memory", PROCESSES: "pids", CPU: "cpu"}
CPU_PERIOD_US: Final = 100_000
KILL_WAIT_SECONDS: Final = 5.0
# A run's cgroup holds the run's processes from before its command starts until it is
# removed; one empty for this long was left by a floom process that died.
STALE_AFTER_SECONDS: Final = 60.0
_PARENT_NAME: Final = "floom"
# A new group's CPU weight, as one process's: cgroup v1 cpu.shares, cgroup v2 cpu.weight.
DEFAULT_CPU_SHARES_V1: Final = 1024
DEFAULT_CPU_WEIGHT_V2: Final = 100


@dataclass(frozen=True)
class CgroupLimits:
    memory_bytes: int
    processes: int
    cpu_cores: float


class CgroupError(FloomError):
    """A run's cgroup could not be created, configured or joined."""

    status = 503
    code = "cgroup_unavailable"


class _RunsWeight:
    """The CPU weight of the group all run cgroups sit in (floom/), kept at one process's
    per live run cgroup of this process.

    Under CPU contention the kernel shares the CPU between sibling groups by weight, and a
    group weighs as one process unless told otherwise: with every run under floom/, all of a
    node's runs together got one process's share, so on a busy host a run took about twice
    as long as the same command outside floom (bench: 150 against 82 ms at load 10). With
    the weight of its live runs, each run weighs as the process it would be outside floom
    (each run's own group keeps the default weight among its siblings, and its quota).

    A weight is written only when it changes: a node that runs one run at a time weighs one
    process's share with or without it, so its runs write nothing (a write costs the kernel
    3-40 us here, more the busier the node's CPUs)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._live: dict[Path, int] = {}
        self._written: dict[Path, int] = {}

    def change(self, parent: Path, version: int, by: int) -> None:
        with self._lock:
            live = self._live[parent] = self._live.get(parent, 0) + by
            if version == 2:
                file, value = "cpu.weight", min(10_000, DEFAULT_CPU_WEIGHT_V2 * max(1, live))
            else:
                file, value = "cpu.shares", DEFAULT_CPU_SHARES_V1 * max(1, live)
            if self._written.get(parent) == value:
                return
            self._written[parent] = value
            # Best effort: a group floom may not weigh only keeps the default.
            with contextlib.suppress(OSError):
                _write(f"{parent}/{file}", str(value))

    def live(self, parent: Path) -> int:
        """How many runs of this process `parent`'s weight counts now."""
        with self._lock:
            return self._live.get(parent, 0)


_runs_weight = _RunsWeight()


def runs_weighed(parent: Path) -> int:
    """How many runs of this process the CPU parent `parent` weighs as now (one process's
    share each): its live runs, not those ended and waiting for their release."""
    return _runs_weight.live(parent)


class RunCgroup:
    """One run's cgroup, with one directory per hierarchy that holds one of its limits
    (one in total on cgroup v2)."""

    def __init__(self, *, version: int, dirs: dict[str, Path]) -> None:
        self.version = version
        # The CPU parent whose weight counts this run, once `weigh` has counted it.
        self._weighed: Path | None = None
        self.dirs = dirs  # limit name -> the directory of the cgroup that enforces it
        # Its files are read and written about a dozen times per run, by path strings built
        # once: through pathlib that cost more CPU than the system calls themselves.
        self._paths = tuple(dict.fromkeys(os.fspath(path) for path in dirs.values()))
        memory, pids = dirs.get(MEMORY), dirs.get(PROCESSES)
        events = "memory.events" if version == 2 else "memory.oom_control"
        self._oom_file = None if memory is None else f"{memory}/{events}"
        self._pids_file = None if pids is None else f"{pids}/pids.events"

    def add(self, pid: int) -> None:
        """Move process `pid` (all its threads) into every hierarchy of this cgroup."""
        for path in self._paths:
            try:
                _write(f"{path}/cgroup.procs", str(pid))
            except ProcessLookupError:
                continue  # it ended already; nothing of it is left to limit
            except OSError as exc:
                raise CgroupError(f"cannot move process {pid} into {path}: {exc}") from exc

    def limit_reached(self) -> str | None:
        """The limit that stopped the tree (`memory` after an OOM kill, `processes` after a
        refused fork), or None."""
        if self._oom_file is not None and _counter(self._oom_file, "oom_kill") > 0:
            return MEMORY
        if self._pids_file is not None and _counter(self._pids_file, "max") > 0:
            return PROCESSES
        return None

    def pids(self) -> set[int]:
        found: set[int] = set()
        for path in self._paths:
            with contextlib.suppress(OSError):
                found.update(int(p) for p in _read(f"{path}/cgroup.procs").split())
        return found

    def tasks(self) -> set[int] | None:
        """The thread ids of every task in the cgroup (`cgroup.threads` on v2, `tasks` on
        v1, where each hierarchy holds the same), or None when they cannot be read."""
        if not self._paths:
            return None
        name = "cgroup.threads" if self.version == 2 else "tasks"
        try:
            return {int(tid) for tid in _read(f"{self._paths[0]}/{name}").split()}
        except (OSError, ValueError):
            return None

    def kill_all(self, timeout: float = KILL_WAIT_SECONDS) -> bool:
        """SIGKILL everything in the cgroup until it is empty; False when it was still not
        empty after `timeout` seconds."""
        deadline = time.monotonic() + timeout
        kill_file = f"{self._paths[0]}/cgroup.kill" if self._paths else None
        while True:
            pids = self.pids()
            if not pids:
                return True
            if self.version == 2 and kill_file is not None and os.path.exists(kill_file):
                with contextlib.suppress(OSError):
                    _write(kill_file, "1")
            else:
                for pid in pids:
                    with contextlib.suppress(OSError):
                        os.kill(pid, signal.SIGKILL)
            if time.monotonic() >= deadline:
                return False
            time.sleep(0.01)

    def configure(self, limits: CgroupLimits) -> None:
        """Write the run's limits and count it in its CPU parent's weight (until `unweigh`
        or `remove`); raises CgroupError. Until then the cgroup limits nothing and weighs
        nothing, so a process may wait in it for a run (floom/sandbox/local/standby.py)."""
        try:
            for limit, directory in self.dirs.items():
                for file, value in _settings(self.version, limit, limits):
                    with contextlib.suppress(FileNotFoundError):  # not on this kernel
                        _write(f"{directory}/{file}", value)
        except OSError as exc:
            raise CgroupError(f"cannot set the limits of {self._paths[0]}: {exc}") from exc
        self.weigh()

    def weigh(self) -> None:
        """Count this run in its CPU parent's weight (until `unweigh` or `remove`)."""
        cpu = self.dirs.get(CPU)
        if cpu is not None and self._weighed is None:
            self._weighed = cpu.parent
            _runs_weight.change(cpu.parent, self.version, +1)

    def unweigh(self) -> None:
        """Count this run out of its CPU parent's weight (its tree has ended): at once, when
        its removal is left for later, or the runs' group would weigh more than the runs
        it holds and take CPU from floom's own threads meanwhile."""
        if self._weighed is not None:
            _runs_weight.change(self._weighed, self.version, -1)
            self._weighed = None

    def remove(self, timeout: float = KILL_WAIT_SECONDS) -> bool:
        """Kill what is left and delete the cgroup's directories; False if one stayed."""
        self.unweigh()
        # By now a run's tree has normally ended and left its cgroup empty: the kernel
        # refuses to remove a cgroup that still holds a process (EBUSY), so removing first
        # and killing only on that refusal keeps the guarantee without reading every
        # hierarchy's process list on each run.
        try:
            if self._rmdirs():
                return True
            self.kill_all(timeout)
            deadline = time.monotonic() + timeout
            while not self._rmdirs():
                if time.monotonic() >= deadline:
                    return False
                time.sleep(0.01)
        except OSError:
            return False
        return True

    def _rmdirs(self) -> bool:
        """Remove every directory still there; False when one is busy (a process left, or
        killed ones still exiting). Raises OSError on any other failure."""
        done = True
        for path in self._paths:
            try:
                os.rmdir(path)
            except FileNotFoundError:
                continue
            except OSError as exc:
                if exc.errno != errno.EBUSY:
                    raise
                done = False
        return done


class CgroupTree:
    """Where this process may create run cgroups, and which limits they enforce here."""

    def __init__(self, *, version: int, parents: dict[str, Path], problem: str = "") -> None:
        self.version = version  # 0 when no hierarchy is usable
        self.parents = parents  # limit name -> the `floom` directory run cgroups go under
        self.problem = problem

    @property
    def enforced(self) -> frozenset[str]:
        return frozenset(self.parents)

    def create(self, name: str, limits: CgroupLimits) -> RunCgroup:
        """Create and configure the cgroup `name`; raises CgroupError, leaving nothing."""
        group = self.make(name)
        try:
            group.configure(limits)
        except CgroupError:
            group.remove(timeout=1.0)
            raise
        return group

    def make(self, name: str) -> RunCgroup:
        """Create the cgroup `name` without limits yet (see RunCgroup.configure); raises
        CgroupError, leaving nothing."""
        dirs = {limit: parent / name for limit, parent in self.parents.items()}
        group = RunCgroup(version=self.version, dirs=dirs)
        try:
            for path in group._paths:
                os.mkdir(path)
        except OSError as exc:
            group.remove(timeout=1.0)
            raise CgroupError(f"cannot create the run's cgroup {name}: {exc}") from exc
        return group


def remove_stale(tree: CgroupTree, *, older_than: float = STALE_AFTER_SECONDS) -> int:
    """Remove the empty run cgroups that were created over `older_than` seconds ago (a
    floom process that died could not); returns how many directories went."""
    removed = 0
    now = time.time()
    for parent in set(tree.parents.values()):
        try:
            children = [p for p in parent.iterdir() if p.is_dir()]
        except OSError:
            continue
        for child in children:
            try:
                if now - child.stat().st_ctime < older_than:
                    continue
                if (child / "cgroup.procs").read_text().strip():
                    continue
                child.rmdir()
                removed += 1
            except OSError:
                continue  # busy, gone meanwhile, or not ours to remove
    return removed


def _settings(version: int, limit: str, limits: CgroupLimits) -> list[tuple[str, str]]:
    quota = str(max(1000, round(limits.cpu_cores * CPU_PERIOD_US)))
    memory = str(limits.memory_bytes)
    if version == 2:
        return {
            # Swap would let a run go past its memory limit; the whole group ends on an OOM
            # kill, as a run that lost a process cannot be trusted to finish well.
            MEMORY: [("memory.max", memory), ("memory.swap.max", "0"), ("memory.oom.group", "1")],
            PROCESSES: [("pids.max", str(limits.processes))],
            CPU: [("cpu.max", f"{quota} {CPU_PERIOD_US}")],
        }[limit]
    return {
        # memsw (memory + swap) must not be below the memory limit, so it is written after.
        MEMORY: [("memory.limit_in_bytes", memory), ("memory.memsw.limit_in_bytes", memory)],
        PROCESSES: [("pids.max", str(limits.processes))],
        CPU: [("cpu.cfs_period_us", str(CPU_PERIOD_US)), ("cpu.cfs_quota_us", quota)],
    }[limit]


def _write(path: str, value: str) -> None:
    """One write of `value` to a cgroup file, as the kernel wants it (no create, no
    truncate)."""
    fd = os.open(path, os.O_WRONLY | os.O_CLOEXEC)
    try:
        os.write(fd, value.encode())
    finally:
        os.close(fd)


def _read(path: str) -> str:
    fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
    try:
        chunks = []
        while chunk := os.read(fd, 65536):
            chunks.append(chunk)
    finally:
        os.close(fd)
    return b"".join(chunks).decode()


def _counter(path: str, key: str) -> int:
    try:
        for line in _read(path).splitlines():
            name, _, value = line.partition(" ")
            if name == key:
                return int(value)
    except (OSError, ValueError):
        pass
    return 0


@functools.cache
def detect() -> CgroupTree:
    """Find the hierarchies this process can create run cgroups in (cached per process)."""
    mounts = _cgroup_mounts()
    own = _own_cgroups()
    v2 = _detect_v2(mounts, own)
    if v2.parents:
        return v2
    v1 = _detect_v1(mounts, own)
    if v1.parents:
        return v1
    problem = "; ".join(p for p in (v2.problem, v1.problem) if p) or "no cgroup file system"
    return CgroupTree(version=0, parents={}, problem=problem)


def _detect_v2(mounts: list[tuple[str, str, str, set[str]]], own: dict[str, str]) -> CgroupTree:
    for mount_root, mountpoint, fstype, _ in mounts:
        if fstype != "cgroup2" or "" not in own:
            continue
        base = Path(mountpoint) / _relative(own[""], mount_root)
        try:
            available = set((base / "cgroup.controllers").read_text().split())
        except OSError:
            continue
        wanted = {limit for limit in LIMITS if _CONTROLLER[limit] in available}
        if not wanted:
            return CgroupTree(version=2, parents={}, problem="cgroup v2 offers no controllers")
        parent = base / _PARENT_NAME
        try:
            _enable(base, wanted)
            parent.mkdir(exist_ok=True)
            _enable(parent, wanted)
            enabled = set((parent / "cgroup.subtree_control").read_text().split())
        except OSError as exc:
            return CgroupTree(version=2, parents={}, problem=f"cgroup v2 at {base}: {exc}")
        parents = {lim: parent for lim in wanted if _CONTROLLER[lim] in enabled}
        if not parents:
            problem = f"cgroup v2 at {base} does not delegate {sorted(wanted)} to children"
            return CgroupTree(version=2, parents={}, problem=problem)
        return _probed(CgroupTree(version=2, parents=parents))
    return CgroupTree(version=2, parents={}, problem="")


def _enable(path: Path, limits: set[str]) -> None:
    # A non-root cgroup that holds processes cannot hand controllers to children (EBUSY);
    # a delegated subtree must then already offer them.
    enabled = set((path / "cgroup.subtree_control").read_text().split())
    for limit in limits:
        controller = _CONTROLLER[limit]
        if controller not in enabled:
            with contextlib.suppress(OSError):
                (path / "cgroup.subtree_control").write_text(f"+{controller}")


def _detect_v1(mounts: list[tuple[str, str, str, set[str]]], own: dict[str, str]) -> CgroupTree:
    parents: dict[str, Path] = {}
    problems = []
    for limit in LIMITS:
        controller = _CONTROLLER[limit]
        for mount_root, mountpoint, fstype, options in mounts:
            if fstype != "cgroup" or controller not in options or controller not in own:
                continue
            parent = Path(mountpoint) / _relative(own[controller], mount_root) / _PARENT_NAME
            try:
                parent.mkdir(exist_ok=True)
            except OSError as exc:
                problems.append(f"cgroup v1 {controller}: {exc}")
                break
            if os.access(parent, os.W_OK):
                parents[limit] = parent
            else:
                problems.append(f"cgroup v1 {controller}: {parent} is not writable")
            break
    tree = CgroupTree(version=1, parents=parents, problem="; ".join(problems))
    return _probed(tree) if parents else tree


def _probed(tree: CgroupTree) -> CgroupTree:
    """Keep the limits that a real run cgroup can hold: create one, join it, drop it."""
    probe = f"probe-{os.getpid()}-{time.monotonic_ns()}"
    try:
        group = tree.create(probe, CgroupLimits(memory_bytes=64 << 20, processes=64, cpu_cores=1))
    except CgroupError as exc:
        return CgroupTree(version=tree.version, parents={}, problem=str(exc))
    group.remove(timeout=1.0)
    return tree


def _relative(path: str, mount_root: str) -> str:
    # Inside a cgroup namespace the mount's root may not be "/".
    if mount_root != "/" and path.startswith(mount_root):
        path = path[len(mount_root) :]
    return path.lstrip("/")


def _cgroup_mounts() -> list[tuple[str, str, str, set[str]]]:
    """(root, mount point, fs type, super options) of each cgroup mount."""
    found = []
    try:
        lines = Path("/proc/self/mountinfo").read_text().splitlines()
    except OSError:
        return []
    for line in lines:
        fields = line.split()
        if " - " not in line or len(fields) < 5:
            continue
        after = line.split(" - ", 1)[1].split()
        if len(after) < 3 or after[0] not in ("cgroup", "cgroup2"):
            continue
        found.append((fields[3], fields[4], after[0], set(after[2].split(","))))
    return found


def _own_cgroups() -> dict[str, str]:
    """Controller name -> this process's cgroup path; "" is the v2 hierarchy."""
    own: dict[str, str] = {}
    try:
        lines = Path("/proc/self/cgroup").read_text().splitlines()
    except OSError:
        return own
    for line in lines:
        _, controllers, path = line.split(":", 2)
        for controller in controllers.split(",") if controllers else [""]:
            own[controller] = path
    return own
