"""The `floom` command as its users run it: a subprocess against a live server, or offline."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from tests.support.harness import LiveServer
from tests.support.ports import free_port


def floom(
    *args: str, env: dict[str, str], stdin: str | None = None
) -> subprocess.CompletedProcess[str]:
    """`floom ARGS` with `env` (and `stdin` typed in); never a traceback on stderr."""
    result = subprocess.run(
        [sys.executable, "-m", "floom.cli", *args],
        env=env,
        input=stdin,
        stdin=subprocess.DEVNULL if stdin is None else None,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert "Traceback" not in result.stderr, result.stderr
    return result


def cli(
    server: LiveServer, *args: str, key: str | None = None, stdin: str | None = None
) -> subprocess.CompletedProcess[str]:
    """`floom ARGS` against `server`, with its admin key or `key`."""
    return floom(*args, env=server.cli_env(key), stdin=stdin)


def offline_env(tmp_path: Path) -> dict[str, str]:
    """An environment whose floom server does not answer (nothing listens on its port)."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("FLOOM_")}
    env["FLOOM_BASE_URL"] = f"http://127.0.0.1:{free_port()}"
    env["FLOOM_API_KEY"] = "flm_unused"
    env["FLOOM_DATA_DIR"] = str(tmp_path / "home")
    return env
