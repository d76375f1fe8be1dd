"""The local sandbox: runs a script worker under bubblewrap, in its own namespaces.

The process sees read-only system directories, its working directory at /work, its output
directory at /output, a private /tmp, and nothing else of the host.
"""

from __future__ import annotations

import contextlib
import functools
import glob
import hashlib
import logging
import os
import select
import shutil
import signal
import subprocess
import threading
import time
import weakref
from collections.abc import Callable, Collection, Mapping
from dataclasses import replace
from pathlib import Path
from typing import Any, Final

from floom.config import LIMIT_CEILINGS, UIDS_PER_RUN
from floom.sandbox.base import (
    LineSink,
    Sandbox,
    SandboxResult,
    SandboxSpec,
    SandboxUnavailable,
    StartedAhead,
    read_only_files,
    validate_spec,
)
from floom.sandbox.fence import node_fence
from floom.sandbox.local import cgroups, limits, procfs, seccomp
from floom.sandbox.local.disks import READY as DISKS_READY
from floom.sandbox.local.disks import Disks, RunDisk
from floom.sandbox.local.identity import (
    STAGE_PTYS,
    IdentityUnavailable,
    SandboxIdentity,
    sandbox_identity,
    share_files,
    stage_script,
)
from floom.sandbox.local.network import (
    OFFLINE_RESOLV_CONF,
    SANDBOX_RESOLV_CONF,
    attach_user_networking,
    floom_slirp_owner,
    protection_summary,
)
from floom.sandbox.local.ns_mount import NamespaceMounter
from floom.sandbox.local.standby import ENTRY_NAME, ChildFds, Launcher, Standby, command_input
from floom.sandbox.local.supervisor import MAX_LINE_BYTES, Supervisor, open_init_pidfd
from floom.sandbox.local.uid_pool import UidLease, UidPool, UidRange
from floom.sandbox.local.warm.pools import (
    WarmKey,
    WarmPools,
    WarmSettings,
    read_record,
    warm_prefix,
)
from floom.sandbox.local.warm.process import WarmUnavailable
from floom.sandbox.local.warm.runs import WarmRun
from floom.sandbox.releases import Releases

__all__ = ["MAX_LINE_BYTES", "LocalSandbox", "SandboxUnavailable"]

log = logging.getLogger("floom.sandbox")

SANDBOX_WORKDIR: Final = "/work"
SANDBOX_OUTPUT_DIR: Final = "/output"
SANDBOX_HOSTNAME: Final = "floom"
OWNER_MARK: Final = "floom-sandbox:"
"""Starts the word of bubblewrap's command line that names the run a sandbox serves, so that
a later executor can recognise (and kill) the sandboxes a killed predecessor left behind:
`owner_marker`, a digest of the work root and the run dir's name, no host path."""
SANDBOX_SHELL: Final = "/bin/sh"
ENTRY_SCRIPT: Final = '. /dev/stdin; : >/dev/stdin; exec </dev/null "$@"'
"""The sandbox's first process, a shell started by bubblewrap after the drop, runs this: it
sources its stdin (standby.command_input: the run's environment, and the command as its
arguments, which no process with floom's privileges reads), empties that memory file so
that no process holds the run's secrets in it any more, and execs the command with stdin
from /dev/null. A shell that cannot read or empty it exits with its own error."""
_MOUNTER = NamespaceMounter()
"""The one thread per process that mounts runs' stages in their launchers' namespaces."""
INERT_ENV: Final = {
    "PATH": "/usr/local/bin:/usr/bin:/bin",
    "HOME": "/tmp",
    "LANG": "C.UTF-8",
    "PYTHONUNBUFFERED": "1",
    "PYTHONDONTWRITEBYTECODE": "1",
}

BWRAP_HINT: Final = "install bubblewrap: apt-get install bubblewrap"
# Entries of /etc that programs need to resolve names, verify TLS, load libraries and
# know the time zone; each bind costs bwrap a mount, so only these. Anything else of /etc
# (pip.conf, npmrc, machine-id, ...) may hold host secrets. /etc/resolv.conf is the
# sandbox's own (network.SANDBOX_RESOLV_CONF, or OFFLINE_RESOLV_CONF without network).
_ETC_ENTRIES: Final = """
    alternatives group hosts ld.so.cache localtime nsswitch.conf os-release passwd pki
    protocols services ssl
""".split()
_ROOT_LINKS: Final = ("bin", "sbin", "lib", "lib32", "lib64", "libx32")
# Strongest first: an explicit user namespace lets bwrap forbid nested ones; hosts that
# refuse it still get the rest of --unshare-all.
_HARDENING_VARIANTS: Final = (("--unshare-user", "--disable-userns"), ())
_FRESH_MOUNTS: Final = ("--proc", "/proc", "--dev", "/dev")
ROOM_PER_SLOT: Final = 8
"""Releases pending at once, per slot (floom/sandbox/releases.py): a run leaves two (its
cgroup and uid, its run dir's disk), each waiting DELAY_SECONDS, and a warm burst ends a
run every few milliseconds."""


class LocalSandbox(Sandbox):
    """Runs each process under bubblewrap with fresh pid, ipc, uts, net and mount namespaces.

    Each run gets its own cgroup (memory, processes, CPU; floom/sandbox/local/limits.py), which
    its launcher joined before the run arrived (floom/sandbox/local/standby.py). A root floom
    gives each run dir a filesystem of `disk_mb` (floom/sandbox/local/disks.py, `make_run_dir`):
    the kernel bounds its disk use; otherwise the disk use is polled. Where no cgroup is
    usable, memory falls back to a per-process RLIMIT_DATA. /tmp and /dev/shm are tmpfs of
    the memory limit's size. The process runs as an unprivileged host uid of its own while
    it runs (floom/sandbox/local/identity.py, uid_pool.py) without capabilities, under a seccomp
    filter (floom/sandbox/local/seccomp.py). Every process the launcher starts before the
    sandbox's process (setpriv, bubblewrap, the sandbox's pid 1) starts with an empty
    environment: the run's environment and command reach only the sandbox's first process,
    after the drop, through a memory file (ENTRY_SCRIPT), so no process with floom's
    privileges reads a byte of them and declared secrets do not show in the host's process
    list. `on_line` is called from the thread that called `run`.

    A spec with `warm` (worker.yml `warm: true`) may start from a warm process of its
    version instead (floom/sandbox/local/warm/), with the same guarantees; where none is
    ready it starts as above.
    """

    name = "local"

    def reap_orphans(
        self,
        *,
        node_id: str,
        work_root: Path,
        live_run_ids: Callable[[], Collection[str]],
    ) -> int:
        # This node's processes are the ones on its work root; node_id names nothing here.
        return self.kill_orphans(work_root, live_run_ids=live_run_ids)

    def kill_orphans(
        self, work_root: Path, *, live_run_ids: Callable[[], Collection[str]] = frozenset
    ) -> int:
        """Kill the bwrap and slirp4netns processes on run dirs under `work_root` whose run
        is not in `live_run_ids()` (asked after the scan); returns how many it killed."""
        # bwrap normally dies with its parent, but not when the parent is killed between
        # starting it and bwrap arming that signal; such a sandbox would run on unattended.
        # slirp4netns exits when its exit fd closes with floom; this catches any that did not.
        marker = os.fsencode(f"{work_root.resolve()}/")
        ours = os.fsencode(owner_prefix(work_root))
        warm = os.fsencode(warm_prefix(work_root))
        token = os.fsencode(self.warm.token) if self.warm is not None else b"-"
        found: list[tuple[int, str]] = []
        for entry in os.listdir("/proc"):
            if not entry.isdigit():
                continue
            try:
                with open(f"/proc/{entry}/cmdline", "rb") as f:
                    argv = f.read().split(b"\0")
            except OSError:
                continue
            if argv[0].endswith(b"bwrap"):
                run_dir = next((a[len(ours) :] for a in argv if a.startswith(ours)), None)
                if run_dir is not None:
                    found.append((int(entry), _run_id_of_dir(run_dir)))
            elif (owner := floom_slirp_owner(entry, argv, marker)) is not None:
                found.append((int(entry), _run_id_of(owner, marker)))
            elif any(a.startswith(warm) and not a.endswith(token) for a in argv[-2:]):
                # A warm process, or a run's child of one, that an earlier floom left: none
                # of its runs can be live here (their pid 1 dies with that child).
                found.append((int(entry), ""))
        live = set(live_run_ids()) if found else set()
        killed = 0
        for pid, run_id in found:
            if run_id in live:
                continue
            try:
                os.kill(pid, signal.SIGKILL)
                killed += 1
            except OSError:
                continue
        cgroups.remove_stale(cgroups.detect())
        return killed

    def __init__(
        self,
        *,
        uids: UidRange | None = UidRange(),
        ceilings: Mapping[str, float] | None = None,
        warm: WarmSettings | None = None,
        runs_at_once: int = 1,
    ) -> None:
        """`uids`: the host uids a root floom's sandboxes run as, one each while it runs
        (floom/sandbox/local/uid_pool.py); None runs them as floom's own uid. `ceilings`: the
        most a run may ask for, by limit (Settings.limit_ceilings): a spec over one is
        refused, whenever its version was deployed. `warm`: the node's warm start settings
        (floom/sandbox/local/warm/); warm starts need a root floom. `runs_at_once`: how many
        runs may start together (the executor's slots): as many disks are kept ready."""
        self._prefix: tuple[str, ...] | None = None
        self._ceilings = dict(ceilings or {})
        # The node's identity; each run's is this one with the uid of its lease.
        self._identity: SandboxIdentity = sandbox_identity(uids)
        self._uids = UidPool(uids) if uids is not None and self._identity.switched else None
        self.standby = Standby(command=self._identity.launcher_command)
        # What runs held (cgroups, uids, run dirs' disks) is released here, off their slots'
        # path (floom/sandbox/releases.py).
        self.releases = Releases(room=ROOM_PER_SLOT * max(1, runs_at_once))
        # The uids every slot's next run may take at once: a run's uid is left to a pending
        # release only while this many stay free beside it (`_release_later`).
        self._uids_for_slots = runs_at_once * UIDS_PER_RUN
        # A root floom gives each run dir a disk of its own (floom/sandbox/local/disks.py).
        self.disks: Disks | None = None
        if self._identity.switched:
            self.disks = Disks(ready=max(DISKS_READY, runs_at_once))
        self.warm: WarmPools | None = None
        if self._uids is not None and (warm is None or warm.enabled):
            self.warm = WarmPools(warm or WarmSettings(), system_args=system_args, uids=self._uids)
            weakref.finalize(self, self.warm.close)
        # Its launchers, disks and threads end with this sandbox, whoever forgets to close it.
        weakref.finalize(self, self.standby.close)
        if self.disks is not None:
            weakref.finalize(self, self.disks.close)

    def close(self) -> None:
        self.standby.close()
        if self.warm is not None:
            self.warm.close()
        if not self.releases.drain():
            log.warning("closing the local sandbox: some runs' releases are still pending")
        if self.disks is not None:
            self.disks.close()

    def make_run_dir(self, path: Path, *, disk_mb: int) -> None:
        # The same path discarded a moment ago (a run's next phase) is taken once it is free.
        self.releases.wait_for(path)
        if self.disks is None or self.disks.provide(path, disk_mb) is None:
            # provide made the folder when it could not mount a disk on it.
            path.mkdir(parents=True, exist_ok=self.disks is not None)

    def release_run_dir(self, path: Path) -> None:
        if self.disks is not None:
            self.disks.release(path)

    def discard_run_dir(self, path: Path, *, delete: Callable[[Path], None]) -> None:
        # A run dir with a disk of its own is unmounted off the caller's path (the unmount
        # waits in the kernel), then deleted; one without is only renamed away now.
        if self.disks is None or self.disks.disk_of(path) is None:
            delete(path)
            return

        def release() -> None:
            self.release_run_dir(path)
            delete(path)

        self.releases.add(release, path=path)

    def _release_later(self, release: Callable[[], object]) -> None:
        """Have `release` (an ended run's cgroup, then its uid) done off the run's slot's
        path, unless the uids of the range this process leaves free, the run's own still
        held, could not start a run on every slot meanwhile: then now, on the slot. So a
        run never finds the range used up by pending releases, and never waits for one (a
        range just large enough for the slots releases each run on its slot, as before)."""
        later = self._uids is None or self._uids.free() >= self._uids_for_slots
        self.releases.add(release, later=later)

    def _disk_of(self, spec: SandboxSpec) -> RunDisk | None:
        """The disk of the run dir that holds `spec`'s work and output dirs, if it has one."""
        run_dir = spec.workdir.parent
        if self.disks is None or spec.output_dir.parent != run_dir:
            return None
        return self.disks.disk_of(run_dir)

    def protections(self) -> dict[str, bool | str]:
        """Which protections runs get on this node, for /healthz and the start line."""
        tree = cgroups.detect()
        enforced = tree.enforced
        missing = [limit for limit in cgroups.LIMITS if limit not in enforced]
        found: dict[str, bool | str] = {
            "namespaces": True,
            "user_namespace": "--unshare-user" in self._command_prefix(),
            "unprivileged_uid": self._identity.uid != 0,
            "sandbox_uid": str(self._uids.uids if self._uids else self._identity.uid),
            "seccomp": seccomp.supported(),
            "cgroup": f"v{tree.version}" if tree.version else "none",
            "memory_limit": limits.MEMORY in enforced,
            "process_limit": limits.PROCESSES in enforced,
            "cpu_limit": limits.CPU in enforced,
            "disk_limit": "enforced" if self.disks and self.disks.usable() else "polled",
            "network": protection_summary(own_uid=self._uids is not None),
            "warm_starts": self.warm is not None,
        }
        if missing:
            found["limits_not_enforced"] = ", ".join(missing)
            found["cgroup_problem"] = tree.problem
        return found

    def warm_stats(self) -> dict[str, Any] | None:
        if self.warm is None:
            return {"enabled": False, "hits": 0, "misses": 0, "pools": []}
        return self.warm.stats()

    def check(self) -> None:
        self._command_prefix()

    @property
    def layers_files(self) -> bool:
        # The overlay is mounted in the run's stage namespace, which exists only when floom
        # is root and starts sandboxes as another uid (floom/sandbox/local/identity.py).
        return self._identity.switched

    def run(
        self,
        spec: SandboxSpec,
        *,
        on_line: LineSink,
        should_cancel: Callable[[], bool],
    ) -> SandboxResult:
        warm = self._start_warm(spec)
        if warm is not None:
            return warm.run(on_line=on_line, should_cancel=should_cancel)
        return self._run_cold(spec, on_line, should_cancel)

    def _run_cold(
        self, spec: SandboxSpec, on_line: LineSink, should_cancel: Callable[[], bool]
    ) -> SandboxResult:
        cold, recording = self._cold(spec)
        return self._supervise(
            cold, *self._start(cold), on_line, should_cancel, recording=recording
        )

    @property
    def starts_ahead(self) -> bool:
        return True

    def start_ahead(self, spec: SandboxSpec) -> StartedAhead:
        warm = self._start_warm(spec)
        if warm is not None:
            return warm
        cold, recording = self._cold(spec)
        return _StartedAhead(self, cold, *self._start(cold), recording=recording)

    def _start_warm(self, spec: SandboxSpec) -> WarmRun | None:
        """`spec` set up on a warm child of its pool to just before its script, or None:
        not a warm spec, or no child ready (the run starts cold; never fails for that)."""
        pools = self.warm
        key = pools.key_of(spec) if pools is not None else None
        if pools is None or key is None or self._uids is None:
            return None
        self._command_prefix()
        validate_spec(spec)
        over = _over_ceiling(spec, self._ceilings)
        if over:
            return None  # the cold start refuses it, with its reasons
        owner = spec.metadata.get("floom_worker") or spec.warm
        child = pools.take(
            key,
            owner=owner,
            work_root=_work_root(spec),
            memory_bytes=spec.memory_mb * 1024 * 1024,
        )
        if child is None:
            return None
        try:
            lease = self._uids.take()
        except BaseException:
            child.discard()
            pools.finished(key)
            raise
        run = WarmRun(
            spec,
            child,
            env=_sandbox_env(spec),
            lease=lease,
            identity=self._identity,
            disk=self._disk_of(spec),
            ended=functools.partial(pools.finished, key),
            cold=functools.partial(self._run_cold, spec),
            release_later=self._release_later,
        )
        try:
            run.set_up()
        except WarmUnavailable as exc:
            log.warning("a warm run starts cold: %s", exc.message)
            return None
        return run

    def _cold(self, spec: SandboxSpec) -> tuple[SandboxSpec, WarmKey | None]:
        """The spec a cold start runs: `spec`, or where its warm pool needs to know what a
        cold run of its version loads, `spec` recording that (pools.read_record)."""
        pools = self.warm
        key = pools.key_of(spec) if pools is not None else None
        if pools is None or key is None or not pools.wants_record(key):
            return spec, None
        return replace(spec, command=pools.command_to_record(spec.command)), key

    def _recorded(self, spec: SandboxSpec, key: WarmKey, ran: bool) -> None:
        if self.warm is None:
            return
        modules = read_record(spec.workdir) if ran else None
        owner = spec.metadata.get("floom_worker") or spec.warm
        self.warm.recorded(key, modules, owner=owner, work_root=_work_root(spec))

    def _start(self, spec: SandboxSpec) -> tuple[Launcher, limits.RunLimits, UidLease | None]:
        """A launcher in its limited cgroup, sent `spec`'s command: bwrap makes the sandbox
        and waits on its block fd until the supervisor releases the command. As root, the
        sandbox runs as a uid of its own (the lease), held until its processes ended."""
        prefix = self._command_prefix()
        validate_spec(spec)
        over = _over_ceiling(spec, self._ceilings)
        if over:
            raise SandboxUnavailable(
                over,
                hint="lower the limit in worker.yml and deploy again, or ask the operator "
                "to raise the setting",
                retryable=False,
            )
        lease = self._uids.take() if self._uids is not None else None
        try:
            launcher, run_limits = self._start_as(spec, prefix, lease)
        except BaseException:
            if lease is not None:
                lease.release()
            raise
        return launcher, run_limits, lease

    def _start_as(
        self, spec: SandboxSpec, prefix: tuple[str, ...], lease: UidLease | None
    ) -> tuple[Launcher, limits.RunLimits]:
        identity = self._identity if lease is None else self._identity.with_uid(lease.uid)
        disk = self._disk_of(spec)
        # A launcher of a root floom has its own mount namespace, made when it started: it
        # must see the run's directories as floom does (standby.Launcher.sees), but for a
        # run's disk, mounted there by its device.
        seeing = [spec.workdir, spec.output_dir] if disk is None else []
        seeing += [spec.files] if spec.files else []
        try:
            launcher = self.standby.take(seeing=seeing if self._identity.switched else ())
        except cgroups.CgroupError as exc:
            raise _not_limited(str(exc)) from exc
        except IdentityUnavailable as exc:
            raise _unprepared(exc) from exc
        try:
            # Before the run's command can exist: the watchdog ends it with its lease.
            _watch(spec, launcher)
            identity.hand_over(spec.workdir, spec.output_dir)
            if spec.files is not None and identity.switched:
                share_files(spec.files)
            # The limits first: while the mount thread works, this thread's writes to the
            # cgroup's files would trade the GIL with it at every system call (0.50 against
            # 0.12 ms, bench/README.md).
            run_limits = limits.RunLimits(spec, launcher.cgroup, disk=disk)
            mounts = self._identity.stage_mounts(
                spec.workdir,
                spec.output_dir,
                spec.files,
                device=disk.device if disk is not None else None,
            )
            # Mounted from here, in the launcher's namespace (no exec of mount), while the
            # command line is made; the launcher's script makes those left (an exec each).
            pending = _MOUNTER.start(launcher.proc.pid, mounts) if mounts else None
            argv = _argv(prefix, spec, launcher.child_fds, identity)
            if pending is not None:
                made = pending.wait()
                left = tuple(m for m, done in zip(mounts, made, strict=True) if not done)
                if left:
                    launcher.begin(stage_script(left))
            launcher.start(
                [*identity.as_sandbox_user(), *argv],
                command_input(_sandbox_env(spec), spec.command),
                resolv_conf=SANDBOX_RESOLV_CONF if spec.network else OFFLINE_RESOLV_CONF,
                prelude=run_limits.shell_lines(),
            )
        except (cgroups.CgroupError, IdentityUnavailable, OSError) as exc:
            launcher.discard()
            _unwatch(spec, launcher)
            raise _unprepared(exc) from exc
        except BaseException:
            launcher.discard()
            _unwatch(spec, launcher)
            raise
        return launcher, run_limits

    def _supervise(
        self,
        spec: SandboxSpec,
        launcher: Launcher,
        run_limits: limits.RunLimits,
        lease: UidLease | None,
        on_line: LineSink,
        should_cancel: Callable[[], bool],
        *,
        recording: WarmKey | None = None,
    ) -> SandboxResult:
        ran = False
        try:
            result = self._supervise_cold(spec, launcher, run_limits, lease, on_line, should_cancel)
            ran = result.exit_code is not None
            return result
        finally:
            if recording is not None:
                self._recorded(spec, recording, ran)

    def _supervise_cold(
        self,
        spec: SandboxSpec,
        launcher: Launcher,
        run_limits: limits.RunLimits,
        lease: UidLease | None,
        on_line: LineSink,
        should_cancel: Callable[[], bool],
    ) -> SandboxResult:
        with contextlib.ExitStack() as run_scope:
            # Registered first so it runs last: the cgroup goes once everything else ended,
            # and the uid with it, off the run's path.
            run_scope.callback(
                self._release_later, functools.partial(_end_limits, run_limits, lease)
            )
            run_scope.callback(run_limits.ended)
            run_scope.callback(launcher.close_input)
            run_scope.callback(_unwatch, spec, launcher)

            def before_command(child_pid: int) -> None:
                # What these steps leave running ends with the run, after its process tree.
                if spec.network:
                    # slirp4netns parses the run's packets as a uid of its own, given back
                    # once it ended (the callbacks run last first).
                    slirp_lease = self._uids.take() if self._uids is not None else None
                    if slirp_lease is not None:
                        run_scope.callback(slirp_lease.release)
                    networking = attach_user_networking(
                        child_pid,
                        allow=spec.network_allow,
                        owner=str(spec.workdir),
                        cgroup=run_limits.cgroup,
                        system_binds=system_args(),
                        uid=None if slirp_lease is None else slirp_lease.uid,
                    )
                    run_scope.callback(networking.close)

            result = Supervisor(launcher.proc, launcher.info_fd, on_line).supervise(
                deadline=time.monotonic() + spec.timeout_seconds,
                should_cancel=should_cancel,
                timeout_seconds=spec.timeout_seconds,
                release_fd=launcher.release_fd,
                before_command=before_command,
                check_limits=run_limits.reached,
                command_released=self.standby.replenish,
            )
        if result.limit_exceeded:
            return replace(result, error=limits.limit_message(result.limit_exceeded, spec))
        return result

    def _abandon(
        self,
        spec: SandboxSpec,
        launcher: Launcher,
        run_limits: limits.RunLimits,
        lease: UidLease | None,
    ) -> None:
        try:
            Supervisor(launcher.proc, launcher.info_fd, _ignore_line).abandon(launcher.release_fd)
        finally:
            launcher.close_input()
            _unwatch(spec, launcher)
            _end_limits(run_limits, lease)
            self.standby.replenish()

    def _command_prefix(self) -> tuple[str, ...]:
        if self._prefix is None:
            bwrap = shutil.which("bwrap")
            if bwrap is None:
                raise SandboxUnavailable("bubblewrap (bwrap) is not on PATH", hint=BWRAP_HINT)
            if self._uids is not None:
                self._uids.check()  # a range that holds a user of this machine is refused
            system = system_args()
            try:
                # Probed as the range's first uid: one like every run's.
                as_sandbox_user = self._identity.as_sandbox_user()
            except IdentityUnavailable as exc:
                raise SandboxUnavailable(
                    f"cannot start sandboxes as uid {self._identity.uid}: {exc}",
                    hint="install util-linux: apt-get install util-linux",
                ) from exc
            namespaces = _probe_namespaces(bwrap, system, as_sandbox_user)
            self._prefix = (bwrap, *namespaces, *system, *_FRESH_MOUNTS)
        return self._prefix


class _StartedAhead(StartedAhead):
    def __init__(
        self,
        sandbox: LocalSandbox,
        spec: SandboxSpec,
        launcher: Launcher,
        run_limits: limits.RunLimits,
        lease: UidLease | None,
        *,
        recording: WarmKey | None = None,
    ) -> None:
        self.spec = spec
        self._sandbox = sandbox
        self._started: _Started | None = (launcher, run_limits, lease)
        self._recording = recording
        self._lock = threading.Lock()

    def _take(self) -> _Started | None:
        with self._lock:
            started, self._started = self._started, None
        return started

    def run(self, *, on_line: LineSink, should_cancel: Callable[[], bool]) -> SandboxResult:
        started = self._take()
        if started is None:
            raise SandboxUnavailable("this sandbox was discarded before its run")
        return self._sandbox._supervise(
            self.spec, *started, on_line, should_cancel, recording=self._recording
        )

    def discard(self) -> None:
        started = self._take()
        if started is not None:
            try:
                self._sandbox._abandon(self.spec, *started)
            finally:
                if self._recording is not None:
                    self._sandbox._recorded(self.spec, self._recording, False)


def _fence_targets(launcher: Launcher) -> list[str]:
    """The sandbox's processes as the lease watchdog finds them: its cgroup's directories, or
    without a cgroup the launcher's process group (bwrap, whose pid 1 dies with it)."""
    if launcher.cgroup is not None:
        return [f"cgroup:{path}" for path in dict.fromkeys(launcher.cgroup.dirs.values())]
    return [f"group:{launcher.proc.pid}"]


def _watch(spec: SandboxSpec, launcher: Launcher) -> None:
    if spec.fence:
        node_fence().watch(spec.fence, _fence_targets(launcher))


def _unwatch(spec: SandboxSpec, launcher: Launcher) -> None:
    # A cgroup's directory is removed with its run and its name never comes back: the
    # attempt's end (forget) drops it. A process group's id may be reused: dropped now.
    if spec.fence and launcher.cgroup is None:
        node_fence().unwatch(spec.fence, _fence_targets(launcher))


_Started = tuple[Launcher, limits.RunLimits, UidLease | None]


def _end_limits(run_limits: limits.RunLimits, lease: UidLease | None) -> None:
    """End what is left of a run and remove its cgroup; then give its uid back, unless a
    process of the run may still be there (the uid stays taken until floom exits)."""
    if run_limits.close() and lease is not None:
        lease.release()


def _ignore_line(stream: str, line: str) -> None:
    """What a sandbox discarded before its command printed: bwrap's own words, unread."""


def _unprepared(exc: Exception) -> SandboxUnavailable:
    return SandboxUnavailable(
        f"cannot prepare the sandbox: {exc}",
        hint="floom needs util-linux (unshare, setpriv, mount) and a writable cgroup "
        "tree when it runs as root",
    )


def _not_limited(problem: str) -> SandboxUnavailable:
    return SandboxUnavailable(
        f"cannot put the run under its limits: {problem}",
        hint="check that floom may write to its cgroups (see /healthz)",
    )


def _run_id_of(path: bytes, marker: bytes) -> str:
    """The run id in a path under the work root, whose run dirs are named `<run>-<attempt>`."""
    return _run_id_of_dir(path[path.index(marker) + len(marker) :].split(b"/", 1)[0])


def _run_id_of_dir(run_dir: bytes) -> str:
    return os.fsdecode(run_dir).rsplit("-", 1)[0]


def owner_marker(workdir: Path) -> str:
    """The word of a sandbox's command line that names its owner: the work dir's run dir
    (`<work root>/<run>-<attempt>/work`) by the work root's digest and its own name. No
    host path: the sandbox reads its pid 1's command line."""
    run_dir = os.path.dirname(os.path.realpath(workdir))
    return owner_prefix(Path(os.path.dirname(run_dir))) + os.path.basename(run_dir)


def owner_prefix(work_root: Path) -> str:
    """How the owner markers of the sandboxes on `work_root`'s run dirs start."""
    digest = hashlib.sha256(os.fsencode(os.path.realpath(work_root))).hexdigest()[:24]
    return f"{OWNER_MARK}{digest}:"


def _argv(
    prefix: tuple[str, ...],
    spec: SandboxSpec,
    fds: ChildFds,
    identity: SandboxIdentity,
) -> list[str]:
    memory = str(spec.memory_mb * 1024 * 1024)
    argv = [*prefix]
    if identity.switched:
        # The run's own devpts, with a `max` (identity.STAGE_PTYS), over bubblewrap's.
        argv += ("--dev-bind", STAGE_PTYS, "/dev/pts")
    argv += ("--size", memory, "--tmpfs", "/dev/shm", "--remount-ro", "/dev")
    argv += ("--size", memory, "--tmpfs", "/tmp")
    work, output = identity.bind_sources(spec.workdir, spec.output_dir)
    argv += ("--bind", work, SANDBOX_WORKDIR)
    for name in read_only_files(spec):
        argv += ("--ro-bind", f"{work}/{name}", f"{SANDBOX_WORKDIR}/{name}")
    argv += ("--bind", output, SANDBOX_OUTPUT_DIR)
    if fds.seccomp is not None:
        argv += ("--seccomp", str(fds.seccomp))
    argv += ("--ro-bind-data", str(fds.resolv_conf), "/etc/resolv.conf")
    argv += ("--chdir", SANDBOX_WORKDIR, "--remount-ro", "/", "--info-fd", str(fds.info))
    argv += ("--block-fd", str(fds.release))
    # The command and its environment follow on the entry shell's stdin; its first
    # argument, until the command replaces it, names the run for kill_orphans.
    argv += ("--", SANDBOX_SHELL, "-c", ENTRY_SCRIPT, ENTRY_NAME, owner_marker(spec.workdir))
    return argv


def _work_root(spec: SandboxSpec) -> Path:
    """The work root a spec's run dir lies in (`<work root>/<run>-<attempt>/work`)."""
    return spec.workdir.parent.parent


def _sandbox_env(spec: SandboxSpec) -> dict[str, str]:
    # Only the backend knows where the output directory is inside the sandbox.
    return {**INERT_ENV, **spec.env, "FLOOM_OUTPUT_DIR": SANDBOX_OUTPUT_DIR}


@functools.cache
def _probe_namespaces(
    bwrap: str, system_args: tuple[str, ...], as_sandbox_user: tuple[str, ...]
) -> tuple[str, ...]:
    """The strongest namespace flags this machine accepts, probed as the uid sandboxes run
    as (`as_sandbox_user` starts bwrap as that uid), since user namespaces may be allowed
    to one uid and refused to another.

    functools.cache keeps only successes, so a host fixed after a failure is probed again.
    """
    problem = ""
    for hardening in _HARDENING_VARIANTS:
        namespaces = (
            "--unshare-all",
            *hardening,
            "--cap-drop",
            "ALL",
            "--die-with-parent",
            "--new-session",
            "--hostname",
            SANDBOX_HOSTNAME,
        )
        try:
            returncode, said = _probe(
                [*as_sandbox_user, bwrap, *namespaces, *system_args, *_FRESH_MOUNTS]
            )
        except (OSError, subprocess.TimeoutExpired) as exc:
            problem = str(exc)
            continue
        if returncode == 0:
            return namespaces
        problem = said
    raise SandboxUnavailable(
        f"bubblewrap cannot create a sandbox on this machine: {problem}",
        hint=f"{BWRAP_HINT}; if it is installed, allow user namespaces "
        "(sysctl kernel.unprivileged_userns_clone=1) or run scripts in E2B (FLOOM_SANDBOX=e2b)",
    )


def _probe(command: list[str]) -> tuple[int, str]:
    """Run `true` under the bubblewrap command line `command`; its return code and stderr.
    Its pid 1 is held by a pidfd from before `true` runs (bwrap waits on --block-fd until
    then), and reaped should it be handed to floom (procfs.reap_if_ours)."""
    info_r, info_w = os.pipe()
    block_r, block_w = os.pipe()
    init_pidfd: int | None = None
    try:
        fds = f"--info-fd {info_w} --block-fd {block_r}".split()
        proc = subprocess.Popen(
            [*command, *fds, "--", "true"],
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
            env=dict(INERT_ENV),
            pass_fds=(info_w, block_r),
        )
        os.close(info_w)
        os.close(block_r)
        info_w = block_r = -1
        with proc:
            info = b""
            while ready := select.select([info_r], [], [], 10)[0]:
                if not (data := os.read(info_r, 4096)):
                    break
                info += data
                if (init_pidfd := open_init_pidfd(info)) is not None:
                    break
            if not ready:
                proc.kill()
            os.close(block_w)
            block_w = -1
            try:
                _, said = proc.communicate(timeout=10)
            except subprocess.TimeoutExpired:
                proc.kill()
                raise
        if init_pidfd is not None:
            procfs.reap_if_ours(init_pidfd, 1.0)
        return proc.returncode, said.decode("utf-8", "replace").strip()
    finally:
        for fd in (info_r, info_w, block_r, block_w, init_pidfd):
            if fd is not None and fd >= 0:
                os.close(fd)


@functools.cache
def system_args() -> tuple[str, ...]:
    """Read-only binds of the host's system directories, for the paths that exist here."""
    args = ["--ro-bind", "/usr", "/usr"]
    for name in _ROOT_LINKS:
        args += _read_only("/" + name)
    for name in _ETC_ENTRIES:
        args += _read_only("/etc/" + name)
    for path in sorted(glob.glob("/etc/python3.*")):  # where Debian keeps sitecustomize.py
        args += _read_only(path)
    return tuple(args)


def _read_only(path: str) -> list[str]:
    if os.path.islink(path):
        resolved = os.path.realpath(path)
        if resolved.startswith("/usr/"):
            # Keep the link itself: programs read /etc/localtime's target to name the zone.
            return ["--symlink", os.readlink(path), path]
        path_to_bind = resolved
    else:
        path_to_bind = path
    if not os.path.exists(path_to_bind):
        return []
    return ["--ro-bind", path_to_bind, path]


def _over_ceiling(spec: SandboxSpec, ceilings: Mapping[str, float]) -> str:
    """What of `spec` is over this node's ceilings ("" for nothing): a version deployed
    before a ceiling was set, or on a node with other settings."""
    for key in _SPEC_LIMITS:
        top, asked = ceilings.get(key), getattr(spec, key)
        if top is not None and asked > top:
            setting = f"FLOOM_{LIMIT_CEILINGS[key].upper()}"
            return (
                f"this run asks for {asked:g} (limits.{key}), over this node's ceiling of "
                f"{top:g} ({setting})"
            )
    return ""


_SPEC_LIMITS: Final = ("timeout_seconds", "memory_mb", "processes", "cpu", "disk_mb")
