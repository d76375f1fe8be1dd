"""Who a sandbox runs as on the host: never root.

When floom runs as root, each sandbox is started as an unprivileged uid and gid of its own,
taken from the range floom owns (floom/sandbox/local/uid_pool.py) for as long as the sandbox runs.
The run's work and output directories are handed to that uid, and
because the path to them may pass through directories only root can enter (a data dir
under /root), they are bind-mounted onto a stage in the mount namespace of the run's launcher
(floom/sandbox/local/standby.py), made before the run, where the sandbox uid can reach them. When
floom is not root, bubblewrap's user namespace maps the sandbox to floom's own uid.
"""

from __future__ import annotations

import contextlib
import os
import shlex
import shutil
import stat
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Final

from floom.errors import FloomError
from floom.sandbox.local import standby
from floom.sandbox.local.ns_mount import Mount
from floom.sandbox.local.uid_pool import UidRange
from floom.sandbox.local.warm.inside import DEVPTS_OPTIONS

STAGE_DIR: Final = Path("/run/floom-sandbox")
"""The stage: root's directory of empty mount points, world-traversable. A launcher serves one
run, in a mount namespace of its own: the run's directories are bound onto the stage's fixed
names there, and the host's stay empty."""
STAGE_WORK: Final = f"{STAGE_DIR}/work"
STAGE_OUTPUT: Final = f"{STAGE_DIR}/output"
STAGE_PTYS: Final = f"{STAGE_DIR}/pts"
"""The run's own devpts instance, which bubblewrap binds over the one its --dev made: that
one has no `max`, and ptys are counted machine-wide (warm/inside.py, PTYS_PER_RUN)."""
# Characters that overlayfs's options would read as separators or escapes: its layers are
# named by the stage's plain names below, never by a host path (which could hold one, and
# which the sandbox would read in its mount table).
_OPTION_SEPARATORS: Final = frozenset(",:\\")
_PLAIN_FILES: Final = f"{STAGE_DIR}/.files"
_PLAIN_RUN: Final = f"{STAGE_DIR}/.run"
_STAGE_POINTS: Final = ("work", "output", ".files", ".run", "pts")
OVERLAY_SCRATCH_SUFFIX: Final = ".overlay"
"""The overlay's scratch dir is the work dir's sibling with this suffix."""


class IdentityUnavailable(FloomError):
    """The tools to start a sandbox as another uid are missing, or its stage is not root's."""

    status = 503
    code = "sandbox_identity_unavailable"


@dataclass(frozen=True)
class SandboxIdentity:
    """The host uid and gid a sandbox runs as; `switched` when they differ from floom's."""

    uid: int
    gid: int
    switched: bool

    def with_uid(self, uid: int) -> SandboxIdentity:
        """This identity as host uid and gid `uid` (one run's, floom/sandbox/local/uid_pool.py)."""
        return replace(self, uid=uid, gid=uid)

    def hand_over(self, *paths: Path) -> None:
        """Give the run's directories (and what floom put in them) to the sandbox uid.
        Links are changed themselves, never followed."""
        if not self.switched:
            return
        for top in paths:
            os.chown(top, self.uid, self.gid, follow_symlinks=False)
            for root, dirs, files in os.walk(top):
                for name in (*dirs, *files):
                    os.chown(os.path.join(root, name), self.uid, self.gid, follow_symlinks=False)

    def bind_sources(self, workdir: Path, output_dir: Path) -> tuple[str, str]:
        """The paths bubblewrap binds the run's work and output dirs from."""
        if self.switched:
            return STAGE_WORK, STAGE_OUTPUT
        return os.path.abspath(workdir), os.path.abspath(output_dir)

    def as_sandbox_user(self) -> tuple[str, ...]:
        """The command line that starts a program as this identity: the run's bubblewrap, after
        its stage, and the namespace probe."""
        if not self.switched:
            return ()
        setpriv = _stage_tools()["setpriv"]
        if setpriv is None:
            raise IdentityUnavailable("setpriv not on PATH")
        return (setpriv, *self._setpriv_args())

    def _setpriv_args(self) -> tuple[str, ...]:
        return (
            f"--reuid={self.uid}",
            f"--regid={self.gid}",
            "--clear-groups",
            "--inh-caps=-all",
            "--bounding-set=-all",
            "--no-new-privs",
            "--",
        )

    def launcher_command(self) -> list[str]:
        """The command line of a sandbox launcher (floom/sandbox/local/standby.py) for this
        identity. As another uid: in a mount namespace of its own, a slave of the host's
        (where the host's mounts are shared, those it makes later reach it; its own never
        leave it), with the stage's mount points made. Raises IdentityUnavailable when a tool
        is missing or the stage is not root's."""
        if not self.switched:
            return standby.plain_launcher()
        tools = _stage_tools()
        missing = sorted(name for name, path in tools.items() if path is None)
        if missing:
            raise IdentityUnavailable(f"{', '.join(missing)} not on PATH")
        make_stage(STAGE_DIR)
        return [
            str(tools["unshare"]),
            "--mount",
            "--propagation=slave",
            "--",
            str(tools["sh"]),
            "-c",
            standby.WAIT_FOR_SCRIPT,
            standby.LAUNCHER_NAME,
        ]

    def stage_mounts(
        self,
        workdir: Path,
        output_dir: Path,
        files: Path | None = None,
        *,
        device: str | None = None,
    ) -> tuple[Mount, ...]:
        """The mounts, in order, that put the run's directories on the stage (floom makes
        them in the launcher's namespace, floom/sandbox/local/ns_mount.py; `stage_script` those
        it could not). Layers and sources by the stage's fixed names only, so that nothing
        in the sandbox's mount table names a host path:
        - with `device`, the run's disk (floom/sandbox/local/disks.py, which holds both dirs at
          its top) mounted by its device at the stage's .run: the binds' roots are then
          paths inside the disk;
        - else the run dir (the work dir's parent) bound there.
        Then the work dir bound, or with `files` laid over them (bound at .files) with an
        overlay whose scratch dir is the work dir's sibling (OVERLAY_SCRATCH_SUFFIX), and
        the output dir bound, and a devpts instance of the run's own made (STAGE_PTYS).
        Empty when this identity is floom's own: bubblewrap then needs no stage."""
        if not self.switched:
            if files is not None:
                raise IdentityUnavailable("a layered work dir needs floom to run as root")
            return ()
        work, output = os.path.abspath(workdir), os.path.abspath(output_dir)
        run = os.path.dirname(work)
        mounts = [Mount.disk(device, _PLAIN_RUN) if device else Mount.bind(run, _PLAIN_RUN)]
        upper = f"{_PLAIN_RUN}/{os.path.basename(work)}"
        if files is None:
            mounts.append(Mount.bind(upper, STAGE_WORK))
        else:
            if _OPTION_SEPARATORS & set(os.path.basename(work)):
                raise IdentityUnavailable(
                    f"the work dir's name {os.path.basename(work)!r} cannot be an overlay's layer"
                )
            _make_scratch(work)
            mounts.append(Mount.bind(os.path.abspath(files), _PLAIN_FILES))
            scratch = f"{_PLAIN_RUN}/{_scratch_of(work).name}"
            mounts.append(Mount.overlay(_overlay_options(_PLAIN_FILES, upper, scratch), STAGE_WORK))
        if os.path.dirname(output) == run:
            mounts.append(Mount.bind(f"{_PLAIN_RUN}/{os.path.basename(output)}", STAGE_OUTPUT))
        else:
            assert device is None, "a run's disk holds its output dir"
            mounts.append(Mount.bind(output, STAGE_OUTPUT))
        mounts.append(Mount.devpts(DEVPTS_OPTIONS, STAGE_PTYS))
        return tuple(mounts)


def stage_script(mounts: tuple[Mount, ...]) -> str:
    """The launcher's shell lines that make `mounts` (exec'ing mount(8)); empty for none."""
    if not mounts:
        return ""
    program = str(_stage_tools()["mount"])
    return "set -e\n" + "".join(shlex.join(m.command(program)) + "\n" for m in mounts)


def make_stage(stage: Path) -> None:
    """The stage's mount points under `stage`, root's and world-traversable (the sandbox
    uid's bubblewrap binds from them). Made on the host, where they stay empty, before each
    launcher starts: no process of the run's makes them. Raises IdentityUnavailable for one
    that is not a directory of root's (a link, a file)."""
    for path in (str(stage), *(f"{stage}/{name}" for name in _STAGE_POINTS)):
        with contextlib.suppress(FileExistsError):
            os.mkdir(path, 0o755)
        found = os.lstat(path)
        if not stat.S_ISDIR(found.st_mode) or found.st_uid != 0:
            raise IdentityUnavailable(
                f"{path} is not a directory of root's; remove it and start the server again"
            )
        if stat.S_IMODE(found.st_mode) != 0o755:
            os.chmod(path, 0o755)


def _scratch_of(work: str) -> Path:
    """The overlay's scratch dir of a work dir."""
    return Path(work).with_name(Path(work).name + OVERLAY_SCRATCH_SUFFIX)


def _make_scratch(work: str) -> Path:
    scratch = _scratch_of(work)
    scratch.mkdir(mode=0o700, exist_ok=True)
    return scratch


def _overlay_options(lower: str, upper: str, scratch: str) -> str:
    return f"lowerdir={lower},upperdir={upper},workdir={scratch}"


def _stage_tools() -> dict[str, str | None]:
    """Where the stage's tools are; looked up once per process while all are found (a
    search of PATH costs more than the rest of the stage)."""
    global _tools
    if _tools is None or None in _tools.values():
        names = ("unshare", "setpriv", "mount", "sh")
        _tools = {name: shutil.which(name) for name in names}
    return _tools


_tools: dict[str, str | None] | None = None


FILES_OWNER: Final = 65534
"""Who owns a version's cached files (and folders): nobody, not root, which a warm process's
user namespace (floom/sandbox/local/warm/process.py) maps, as it maps no uid of the host's
but this and the sandbox pool's: its overlay copies a file up as that owner's. No host
process reaches them as nobody: the data dir is 0700 and root's."""


def share_files(files: Path) -> None:
    """Make a version's cached files fit to lie under any run's work dir, once: a run sees
    them only through an overlay, where a write copies the file up into the run's own layer
    and never reaches them, but overlayfs lets the run's uid open a file for writing (or
    add and remove names in a folder) only as the file's mode allows. Runs have uids of
    their own, so the files are FILES_OWNER's, every folder 0777 and every file writable by
    all (its execute bits kept): a script rewrites a version file in place as it could its
    own copy. No host process but root reaches them: the data dir is 0700 (and the versions
    folder is made so here). Links are changed themselves, never followed. The top folder
    is changed last, so its mode says the whole tree was."""
    if os.geteuid() != 0:
        return
    top = os.lstat(files)
    if stat.S_IMODE(top.st_mode) == 0o777 and top.st_uid == FILES_OWNER:
        return
    parent = os.lstat(files.parent)
    if parent.st_uid == 0 and stat.S_IMODE(parent.st_mode) & 0o077:
        os.chmod(files.parent, 0o700)
    for root, dirs, names in os.walk(files, topdown=False):
        for name in (*dirs, *names):
            path = os.path.join(root, name)
            os.chown(path, FILES_OWNER, FILES_OWNER, follow_symlinks=False)
            found = os.lstat(path)
            if stat.S_ISDIR(found.st_mode):
                os.chmod(path, 0o777)
            elif stat.S_ISREG(found.st_mode):
                os.chmod(path, stat.S_IMODE(found.st_mode) | 0o666)
    os.chown(files, FILES_OWNER, FILES_OWNER, follow_symlinks=False)
    os.chmod(files, 0o777)


def sandbox_identity(uids: UidRange | None = None) -> SandboxIdentity:
    """The identity sandboxes get from a floom running as the current user: as root, the
    first uid of `uids` (each run's own is `with_uid` of its lease); otherwise, or without
    `uids`, floom's own uid."""
    if os.geteuid() == 0 and uids is not None:
        return SandboxIdentity(uid=uids.base, gid=uids.base, switched=True)
    return SandboxIdentity(uid=os.geteuid(), gid=os.getegid(), switched=False)
