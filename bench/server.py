"""What the benches share: a real `floom serve` in a subprocess on a free loopback port with a
fresh data dir, and readings of a process tree's memory and CPU from /proc."""

from __future__ import annotations

import glob
import os
import secrets
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import httpx

HOST = "127.0.0.1"
VENV_BIN = Path(sys.executable).parent
HEALTH_DEADLINE_SECONDS = 60.0
SHUTDOWN_WAIT_SECONDS = 15.0
HTTP_TIMEOUT_SECONDS = 30.0


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind((HOST, 0))
        return int(s.getsockname()[1])


def rss_kib(pid: int, field_name: str = "VmRSS") -> int:
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith(field_name + ":"):
                return int(line.split()[1])
    except (OSError, ValueError, IndexError):
        pass
    return 0


def descendants(pid: int) -> list[int]:
    children: dict[int, list[int]] = {}
    for stat in glob.glob("/proc/[0-9]*/stat"):
        try:
            text = Path(stat).read_text()
            ppid = int(text.rsplit(")", 1)[1].split()[1])
            children.setdefault(ppid, []).append(int(stat.split("/")[2]))
        except (OSError, ValueError, IndexError):
            continue
    found, todo = [], [pid]
    while todo:
        for child in children.get(todo.pop(), []):
            found.append(child)
            todo.append(child)
    return found


def tree_rss_mb(pid: int) -> tuple[float, int]:
    """Resident set size of a process and its descendants (MiB), and the descendant count."""
    kids = descendants(pid)
    return (rss_kib(pid) + sum(rss_kib(k) for k in kids)) / 1024, len(kids)


CLOCK_TICKS = os.sysconf("SC_CLK_TCK")


def proc_cpu_seconds(pid: int) -> float:
    """utime + stime of one process (all its threads)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / CLOCK_TICKS


def own_cpu_seconds() -> float:
    t = os.times()
    return t.user + t.system


def machine_busy_seconds() -> float:
    """CPU seconds spent not idle on the whole machine (all cores, all processes).

    The sandboxed processes are counted only here: bwrap exits as soon as the command
    does, so their CPU never reaches the parent's rusage.
    """
    values = [int(v) for v in Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:]]
    idle = values[3] + (values[4] if len(values) > 4 else 0)  # idle + iowait
    return (sum(values[:8]) - idle) / CLOCK_TICKS


def tree_cpu_seconds(pid: int) -> float:
    """utime + stime of a process and its live descendants (children already reaped, such
    as each run's bwrap, are not counted: their CPU is the sandbox's, not the server's)."""
    total = 0.0
    for p in (pid, *descendants(pid)):
        try:
            total += proc_cpu_seconds(p)
        except (OSError, ValueError, IndexError):
            continue
    return total


class Server:
    """`floom serve` on a free loopback port with a fresh data dir."""

    def __init__(
        self, root: Path, database_url: str | None, extra_env: dict[str, str] | None = None
    ) -> None:
        root.mkdir(parents=True, exist_ok=True)
        self.data_dir = root / "data"
        self.port = free_port()
        self.key = "flm_bench_" + secrets.token_urlsafe(24)
        self.base_url = f"http://{HOST}:{self.port}"
        self.log_path = root / "server.log"
        env = {k: v for k, v in os.environ.items() if not k.startswith("FLOOM_")}
        env.update(
            FLOOM_DATA_DIR=str(self.data_dir),
            FLOOM_BOOTSTRAP_API_KEY=self.key,
            FLOOM_DEPLOY_EXAMPLES="true",
            FLOOM_HOST=HOST,
            FLOOM_PORT=str(self.port),
        )
        if database_url:
            env["FLOOM_DATABASE_URL"] = database_url
        env.update(extra_env or {})
        argv = [str(VENV_BIN / "floom"), "serve", "--port", str(self.port)]
        self._log = self.log_path.open("wb")
        self.started = time.perf_counter()
        self.proc = subprocess.Popen(
            argv,
            env=env,
            cwd=root,
            stdin=subprocess.DEVNULL,
            stdout=self._log,
            stderr=subprocess.STDOUT,
        )
        self.client = self.new_client()
        self.ready_seconds = 0.0

    def new_client(self) -> httpx.Client:
        return httpx.Client(
            base_url=self.base_url,
            headers={"Authorization": f"Bearer {self.key}"},
            timeout=HTTP_TIMEOUT_SECONDS,
            trust_env=False,  # never a proxy: loopback only
        )

    def log_tail(self, lines: int = 30) -> str:
        self._log.flush()
        text = self.log_path.read_text(errors="replace").splitlines()
        return "\n".join(text[-lines:])

    def wait_ready(self) -> None:
        deadline = time.monotonic() + HEALTH_DEADLINE_SECONDS
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                code = self.proc.returncode
                raise RuntimeError(f"the server exited ({code}):\n{self.log_tail()}")
            try:
                if self.client.get("/healthz", timeout=1.0).status_code == 200:
                    self.ready_seconds = time.perf_counter() - self.started
                    return
            except httpx.TransportError:
                pass
            time.sleep(0.05)
        raise RuntimeError(f"no /healthz within {HEALTH_DEADLINE_SECONDS:g} s:\n{self.log_tail()}")

    def stop(self) -> tuple[str, float]:
        """SIGINT (uvicorn's graceful stop), bounded wait, then SIGKILL."""
        self.client.close()
        t0 = time.perf_counter()
        how = "already exited"
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGINT)
            try:
                self.proc.wait(SHUTDOWN_WAIT_SECONDS)
                how = f"SIGINT, exit code {self.proc.returncode}"
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(5)
                how = f"killed after {SHUTDOWN_WAIT_SECONDS:g} s"
        self._log.close()
        return how, time.perf_counter() - t0
