"""Two node processes never run sandboxes from one data dir: the second is refused at start."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from floom.engine.work_root import hold_work_root, release_work_root
from floom.errors import DataDirInUse
from tests.support.ports import free_port
from tests.support.processes.server_process import ServerProcess

HOLD_AND_WAIT = """
import sys
from pathlib import Path
from floom.engine.work_root import hold_work_root
hold_work_root(Path(sys.argv[1]))
print("held", flush=True)
sys.stdin.read()
"""


def test_a_second_floom_serve_on_the_same_data_dir_is_refused_and_leaves_the_first_running(
    tmp_path: Path,
) -> None:
    first = ServerProcess(tmp_path / "data", f"sqlite:///{tmp_path / 'floom.db'}")
    first.start()
    try:
        env = {k: v for k, v in os.environ.items() if not k.startswith("FLOOM_")}
        env.update(
            FLOOM_DATA_DIR=str(first.data_dir),
            FLOOM_DATABASE_URL=first.database_url,
            FLOOM_DEPLOY_EXAMPLES="false",
        )
        second = subprocess.run(
            [sys.executable, "-m", "floom.cli", "serve", "--port", str(free_port())],
            env=env,
            capture_output=True,
            text=True,
            timeout=60,
        )
        assert second.returncode == 1, second.stderr
        assert f"another floom node (pid {first.proc.pid}) runs" in second.stderr  # type: ignore[union-attr]
        assert "FLOOM_DATA_DIR" in second.stderr
        assert "Traceback" not in second.stderr
        with first.client() as api:
            assert api.get("/healthz").status_code == 200
    finally:
        first.stop()
    # Once the first node stopped, the data dir is free again.
    hold_work_root(first.data_dir)
    release_work_root(first.data_dir)


def test_the_lock_is_held_until_the_process_that_holds_it_ends(tmp_path: Path) -> None:
    holder = subprocess.Popen(
        [sys.executable, "-c", HOLD_AND_WAIT, str(tmp_path)],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert holder.stdout is not None
        assert holder.stdout.readline() == "held\n"
        with pytest.raises(DataDirInUse) as refused:
            hold_work_root(tmp_path)
        assert f"pid {holder.pid}" in refused.value.message
    finally:
        holder.communicate("", timeout=10)
    hold_work_root(tmp_path)  # free once it ended, even without a release
    hold_work_root(tmp_path)  # and taken again by its holder: a no-op
    release_work_root(tmp_path)
