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

# Runs as root in the run's private mount namespace: a small world-traversable tmpfs over
# the stage mount point, the run's directories bound under it at their host paths, then
# the rest of the command line (setpriv, prlimit, bwrap).
_STAGE_SCRIPT: Final = """set -e
mount -t tmpfs -o mode=0755,size=64k,nosuid,nodev,noexec floom-stage "$1"
mkdir -p "$1$2" "$1$3"
mount --bind "$2" "$1$2"
mount --bind "$3" "$1$3"
shift 3
exec "$@"
"""


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

    def launcher(self, workdir: Path, output_dir: Path) -> list[str]:
        """The command line that starts bubblewrap's own command line as this identity."""
        if not self.switched:
            return []
        tools = {name: shutil.which(name) for name in ("unshare", "setpriv", "mount", "sh")}
        missing = sorted(name for name, path in tools.items() if path is None)
        if missing:
            raise IdentityUnavailable(f"{', '.join(missing)} not on PATH")
        STAGE_DIR.mkdir(mode=0o700, exist_ok=True)
        return [
            str(tools["unshare"]),
            "--mount",
            "--propagation=private",
            "--",
            str(tools["sh"]),
            "-c",
            _STAGE_SCRIPT,
            "floom-stage",
            str(STAGE_DIR),
            os.path.abspath(workdir),
            os.path.abspath(output_dir),
            str(tools["setpriv"]),
            *self._setpriv_args(),
        ]


def sandbox_identity(configured_uid: int = DEFAULT_SANDBOX_UID) -> SandboxIdentity:
    """The identity sandboxes get from a floom running as the current user."""
    if os.geteuid() == 0 and configured_uid != 0:
        return SandboxIdentity(uid=configured_uid, gid=configured_uid, switched=True)
    return SandboxIdentity(uid=os.geteuid(), gid=os.getegid(), switched=False)
