"""Who a sandbox runs as on the host: never root.

When floom runs as root, each sandbox is started as a dedicated unprivileged uid and gid
(setting `sandbox_uid`). The run's work and output directories are handed to that uid, and
because the path to them may pass through directories only root can enter (a data dir
under /root), they are bind-mounted onto a small stage in a private mount namespace that
exists only for the run's bubblewrap, where the sandbox uid can reach them. When floom is
not root, bubblewrap's user namespace maps the sandbox to floom's own uid.
"""

from __future__ import annotations

import os
import shutil
from dataclasses import dataclass
from pathlib import Path
from typing import Final

from floom.errors import FloomError

DEFAULT_SANDBOX_UID: Final = 65534
STAGE_DIR: Final = Path("/run/floom-sandbox")
"""Mount point of each run's stage, in the run's own mount namespace only."""

# Each stage script runs as root in the run's private mount namespace, already in the run's
# cgroup (floom/sandbox/standby.py): a small world-traversable tmpfs over the stage mount
# point, the run's directories bound under it at their host paths, then the rest of the
# command line (setpriv, prlimit, bwrap).
_STAGE_SCRIPT: Final = """set -e
mount -t tmpfs -o mode=0755,size=64k,nosuid,nodev,noexec floom-stage "$1"
mkdir -p "$1$2" "$1$3"
mount --bind "$2" "$1$2"
mount --bind "$3" "$1$3"
shift 3
exec "$@"
"""


# The same, with the run's work dir laid over the version's files: one overlay mount in
# place of the work dir's bind ($4: the version's cached files, $5: the overlay's scratch
# dir, beside the work dir on the same mount as overlayfs wants), so starting a run costs
# no more mounts than before.
_LAYERED_STAGE_SCRIPT: Final = """set -e
mount -t tmpfs -o mode=0755,size=64k,nosuid,nodev,noexec floom-stage "$1"
mkdir -p "$1$2" "$1$3"
mount -t overlay floom-work -o "lowerdir=$4,upperdir=$2,workdir=$5" "$1$2"
mount --bind "$3" "$1$3"
shift 5
exec "$@"
"""
# Characters that overlayfs's options would read as separators or escapes: paths holding
# one are first bound to plain names under the stage (two more mounts per run).
_OPTION_SEPARATORS: Final = frozenset(",:\\")
_LAYERED_STAGE_SCRIPT_BOUND: Final = """set -e
mount -t tmpfs -o mode=0755,size=64k,nosuid,nodev,noexec floom-stage "$1"
mkdir -p "$1$2" "$1$3" "$1/.files" "$1/.run"
mount --bind "$4" "$1/.files"
mount --bind "$(dirname "$2")" "$1/.run"
mount -t overlay floom-work \\
    -o "lowerdir=$1/.files,upperdir=$1/.run/$(basename "$2"),workdir=$1/.run/$(basename "$5")" \\
    "$1$2"
mount --bind "$3" "$1$3"
shift 5
exec "$@"
"""
OVERLAY_SCRATCH_SUFFIX: Final = ".overlay"
"""The overlay's scratch dir is the work dir's sibling with this suffix."""


class IdentityUnavailable(FloomError):
    """The tools to start a sandbox as another uid are missing."""

    status = 503
    code = "sandbox_identity_unavailable"


@dataclass(frozen=True)
class SandboxIdentity:
    """The host uid and gid a sandbox runs as; `switched` when they differ from floom's."""

    uid: int
    gid: int
    switched: bool

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

    def hand_over_files(self, files: Path) -> None:
        """Give a version's cached files to the sandbox uid, once: a run sees them only
        through an overlay (a write lands in its own layer), and owning them lets a script
        rewrite a version file in place as it could its own copy. The top dir is changed
        last, so its owner says the whole tree was."""
        if not self.switched or os.lstat(files).st_uid == self.uid:
            return
        for root, dirs, names in os.walk(files, topdown=False):
            for name in (*dirs, *names):
                os.chown(os.path.join(root, name), self.uid, self.gid, follow_symlinks=False)
        os.chown(files, self.uid, self.gid, follow_symlinks=False)

    def bind_source(self, path: Path) -> str:
        """The path bubblewrap binds `path` from."""
        absolute = os.path.abspath(path)
        return f"{STAGE_DIR}{absolute}" if self.switched else absolute

    def probe_prefix(self) -> tuple[str, ...]:
        """The command line that starts a program as this identity (no directories)."""
        if not self.switched:
            return ()
        setpriv = shutil.which("setpriv")
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

    def stage_command(
        self,
        workdir: Path,
        output_dir: Path,
        files: Path | None = None,
    ) -> list[str]:
        """The command line that starts bubblewrap's own command line as this identity;
        with `files`, the work dir it binds is laid over them (an overlay whose scratch dir
        is the work dir's sibling, see OVERLAY_SCRATCH_SUFFIX).

        An empty list when this identity is floom's own: bubblewrap then needs no stage."""
        if not self.switched:
            if files is not None:
                raise IdentityUnavailable("a layered work dir needs floom to run as root")
            return []
        tools = _stage_tools()
        missing = sorted(name for name, path in tools.items() if path is None)
        if missing:
            raise IdentityUnavailable(f"{', '.join(missing)} not on PATH")
        STAGE_DIR.mkdir(mode=0o700, exist_ok=True)
        dirs = [os.path.abspath(workdir), os.path.abspath(output_dir)]
        script = _STAGE_SCRIPT
        if files is not None:
            work = Path(dirs[0])
            scratch = work.with_name(work.name + OVERLAY_SCRATCH_SUFFIX)
            scratch.mkdir(mode=0o700, exist_ok=True)
            dirs += [os.path.abspath(files), str(scratch)]
            plain = not any(_OPTION_SEPARATORS & set(path) for path in dirs)
            script = _LAYERED_STAGE_SCRIPT if plain else _LAYERED_STAGE_SCRIPT_BOUND
        return [
            str(tools["unshare"]),
            "--mount",
            "--propagation=private",
            "--",
            str(tools["sh"]),
            "-c",
            script,
            "floom-stage",
            str(STAGE_DIR),
            *dirs,
            str(tools["setpriv"]),
            *self._setpriv_args(),
        ]


def _stage_tools() -> dict[str, str | None]:
    """Where the stage's tools are; looked up once per process while all are found (a
    search of PATH costs more than the rest of the stage)."""
    global _tools
    if _tools is None or None in _tools.values():
        _tools = {name: shutil.which(name) for name in ("unshare", "setpriv", "mount", "sh")}
    return _tools


_tools: dict[str, str | None] | None = None


def sandbox_identity(configured_uid: int = DEFAULT_SANDBOX_UID) -> SandboxIdentity:
    """The identity sandboxes get from a floom running as the current user."""
    if os.geteuid() == 0 and configured_uid != 0:
        return SandboxIdentity(uid=configured_uid, gid=configured_uid, switched=True)
    return SandboxIdentity(uid=os.geteuid(), gid=os.getegid(), switched=False)
