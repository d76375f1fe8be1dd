"""Benchmark: floom's run path against the floor of bubblewrap starting the same script.

Run from the repository root:

    .venv/bin/python bench/bench_runs.py [--runs N] [--throughput-runs M] [--database-url URL]

It measures, in one go and side by side:

1. the floor: plain `subprocess.run` of prlimit + bwrap with the command line that
   floom/sandbox/local.py builds, running `python3 run.py` of workers/hello: per-run wall
   time over N sequential runs, and runs/second from 2 and 4 parallel loops;
2. floom: a real `floom serve` subprocess on a free loopback port with a fresh data dir:
   trigger-to-finish latency of N sequential runs of the example `hello` worker, the
   throughput of M runs queued at once, and the server's resident memory idle and after
   the load.

It prints figures, ratios and a table with the targets and OK/MISS next to them; it asserts
nothing. All traffic goes to 127.0.0.1; every wait is bounded.
"""

from __future__ import annotations

import argparse
import glob
import importlib.util
import json
import math
import os
import platform
import secrets
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from typing import Any

import httpx

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from floom.services.run_rules import ACTIVE, FINISHED, SUCCEEDED  # noqa: E402

HELLO = REPO / "workers" / "hello"
VENV_BIN = Path(sys.executable).parent
HOST = "127.0.0.1"

# Targets (see bench/README.md).
FLOOR_REFERENCE_MS = 34.0
OVERHEAD_TARGET_MS = 15.0
THROUGHPUT_TARGET = 30.0
IDLE_RSS_TARGET_MB = 120.0

POLL_SECONDS = 0.002  # polling where a wait is not possible
WAIT_SECONDS = 30.0  # latency phase: GET /runs/{id}?wait=, answered as the run ends
IDLE_SECONDS = 2.0  # settle time before the idle RSS and idle CPU readings
HEAD_START_FRACTION = 0.8  # pass B: first GET after this share of the fastest floor run
RUN_DEADLINE_SECONDS = 30.0  # one run, trigger to terminal
HEALTH_DEADLINE_SECONDS = 30.0
THROUGHPUT_DEADLINE_SECONDS = 90.0
SHUTDOWN_WAIT_SECONDS = 15.0
HTTP_TIMEOUT_SECONDS = 10.0

# ---------------------------------------------------------------------------------------
# The floor: the bwrap command line of floom/sandbox/local.py, replicated here on purpose
# (the floor must not go through floom's code). `compare_with_floom` checks it still matches.

SANDBOX_WORKDIR = "/work"
SANDBOX_OUTPUT_DIR = "/output"
SANDBOX_HOSTNAME = "floom"
INERT_ENV = {
    "PATH": "/usr/local/bin:/usr/bin:/bin",
    "HOME": "/tmp",
    "LANG": "C.UTF-8",
    "PYTHONUNBUFFERED": "1",
    "PYTHONDONTWRITEBYTECODE": "1",
}
ETC_ENTRIES = (
    "alternatives",
    "group",
    "hosts",
    "ld.so.cache",
    "localtime",
    "nsswitch.conf",
    "os-release",
    "passwd",
    "pki",
    "protocols",
    "resolv.conf",
    "services",
    "ssl",
)
ROOT_LINKS = ("bin", "sbin", "lib", "lib32", "lib64", "libx32")
HARDENING_VARIANTS: tuple[tuple[str, ...], ...] = (("--unshare-user", "--disable-userns"), ())
HELLO_MEMORY_MB = 256  # limits.memory_mb of workers/hello/worker.yml
HELLO_COMMAND = ["python3", "run.py"]
FLOOR_RUN_ENV = {
    "FLOOM_RUN_ID": "run_bench",
    "FLOOM_ATTEMPT": "1",
    "FLOOM_WORKER": "hello",
    "FLOOM_VERSION_ID": "ver_bench",
}


def _read_only(path: str) -> list[str]:
    if os.path.islink(path):
        resolved = os.path.realpath(path)
        if resolved.startswith("/usr/"):
            return ["--symlink", os.readlink(path), path]
        target = resolved
    else:
        target = path
    if not os.path.exists(target):
        return []
    return ["--ro-bind", target, path]


def system_args() -> list[str]:
    args = ["--ro-bind", "/usr", "/usr"]
    for name in ROOT_LINKS:
        args += _read_only("/" + name)
    for name in ETC_ENTRIES:
        args += _read_only("/etc/" + name)
    for path in sorted(glob.glob("/etc/python3.*")):
        args += _read_only(path)
    return args


def probe_namespaces(bwrap: str, system: list[str]) -> list[str]:
    problem = ""
    for hardening in HARDENING_VARIANTS:
        namespaces = [
            "--unshare-all",
            *hardening,
            "--cap-drop",
            "ALL",
            "--die-with-parent",
            "--new-session",
            "--hostname",
            SANDBOX_HOSTNAME,
        ]
        argv = [bwrap, *namespaces, *system, "--proc", "/proc", "--dev", "/dev", "--", "true"]
        done = subprocess.run(
            argv,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
            env=dict(INERT_ENV),
            timeout=10,
        )
        if done.returncode == 0:
            return namespaces
        problem = done.stderr.decode("utf-8", "replace").strip()
    raise SystemExit(f"bench: bubblewrap cannot create a sandbox here: {problem}")


def floor_prefix() -> list[str]:
    prlimit, bwrap = shutil.which("prlimit"), shutil.which("bwrap")
    if prlimit is None or bwrap is None:
        raise SystemExit("bench: prlimit and bwrap must be on PATH (apt-get install bubblewrap)")
    system = system_args()
    namespaces = probe_namespaces(bwrap, system)
    return [prlimit, bwrap, *namespaces, *system, "--proc", "/proc", "--dev", "/dev"]


def floor_argv(prefix: list[str], workdir: Path, output_dir: Path, info_fd: int) -> list[str]:
    memory = str(HELLO_MEMORY_MB * 1024 * 1024)
    prlimit, *bwrap = prefix
    argv = [prlimit, f"--data={memory}", "--core=0", "--", *bwrap]
    argv += ["--size", memory, "--tmpfs", "/dev/shm", "--remount-ro", "/dev"]
    argv += ["--size", memory, "--tmpfs", "/tmp"]
    argv += ["--bind", os.path.abspath(workdir), SANDBOX_WORKDIR]
    argv += ["--bind", os.path.abspath(output_dir), SANDBOX_OUTPUT_DIR]
    argv += ["--chdir", SANDBOX_WORKDIR, "--remount-ro", "/", "--info-fd", str(info_fd)]
    argv.append("--")  # hello declares no network, so no --share-net
    argv += HELLO_COMMAND
    return argv


def floor_env() -> dict[str, str]:
    return {**INERT_ENV, **FLOOR_RUN_ENV, "FLOOM_OUTPUT_DIR": SANDBOX_OUTPUT_DIR}


def compare_with_floom(prefix: list[str], workdir: Path, output_dir: Path) -> str:
    """Whether floom's own builder produces the same argv and env (read-only use of floom)."""
    try:
        from floom.sandbox import local
        from floom.sandbox.base import SandboxSpec

        spec = SandboxSpec(
            run_id="run_bench",
            command=list(HELLO_COMMAND),
            workdir=workdir,
            output_dir=output_dir,
            env=dict(FLOOR_RUN_ENV),
            network=False,
            timeout_seconds=30.0,
            memory_mb=HELLO_MEMORY_MB,
        )
        theirs = local._argv(local.LocalSandbox()._command_prefix(), spec, 99)
        their_env = local._sandbox_env(spec)
    except Exception as exc:  # floom's internals may move; the floor does not depend on them
        return f"not compared ({type(exc).__name__}: {exc})"
    ours = floor_argv(prefix, workdir, output_dir, 99)
    if ours == theirs and their_env == floor_env():
        return "identical to floom.sandbox.local (argv and env)"
    extra = sorted(set(theirs) - set(ours))
    missing = sorted(set(ours) - set(theirs))
    return f"DIFFERS from floom.sandbox.local: floom adds {extra}, lacks {missing}"


class FloorSlot:
    """One private copy of workers/hello plus an output dir, reused by one loop."""

    def __init__(self, root: Path, index: int, prefix: list[str]) -> None:
        base = root / f"slot{index}"
        self.workdir = base / "work"
        self.output_dir = base / "output"
        shutil.copytree(HELLO, self.workdir)
        self.output_dir.mkdir(parents=True)
        (self.workdir / "inputs.json").write_text(json.dumps({"name": "bench", "times": 1}))
        self.prefix = prefix
        self.env = floor_env()

    def run_once(self) -> float:
        """Seconds of one sandboxed `python3 run.py`; raises if the script did not succeed."""
        (self.workdir / "result.json").unlink(missing_ok=True)
        info_r, info_w = os.pipe()
        try:
            argv = floor_argv(self.prefix, self.workdir, self.output_dir, info_w)
            t0 = time.perf_counter()
            done = subprocess.run(
                argv,
                stdin=subprocess.DEVNULL,
                capture_output=True,
                env=self.env,
                start_new_session=True,
                pass_fds=(info_w,),
                timeout=RUN_DEADLINE_SECONDS,
            )
            elapsed = time.perf_counter() - t0
        finally:
            os.close(info_w)
            os.close(info_r)
        if done.returncode != 0:
            raise RuntimeError(f"floor run failed ({done.returncode}): {done.stderr[-400:]!r}")
        report = json.loads((self.workdir / "result.json").read_text())
        if report["outputs"]["greeting"] != "Hello, bench!":
            raise RuntimeError(f"floor run gave unexpected outputs: {report}")
        return elapsed


@dataclass
class FloorResult:
    prefix: list[str]
    argv_check: str
    python: str
    latencies: list[float]
    cpu: CpuPerRun  # of the sequential runs; cpu.rest is the sandboxed processes
    parallel: dict[int, float] = field(default_factory=dict)  # loops -> runs/s


def run_floor(runs: int, root: Path) -> FloorResult:
    prefix = floor_prefix()
    probe = FloorSlot(root, 0, prefix)
    check = compare_with_floom(prefix, probe.workdir, probe.output_dir)
    python = subprocess.run(
        ["python3", "--version"], env=INERT_ENV, capture_output=True, text=True, check=False
    ).stdout.strip()
    for _ in range(3):  # warm the page cache and bwrap's binaries
        probe.run_once()
    latencies, cpu = measure_cpu(None, runs, lambda: [probe.run_once() for _ in range(runs)])
    result = FloorResult(prefix, check, python, latencies, cpu)
    for loops in (2, 4):
        slots = [FloorSlot(root / f"p{loops}", i, prefix) for i in range(loops)]
        per_loop = max(5, math.ceil(runs / loops))
        errors: list[BaseException] = []

        def loop(
            slot: FloorSlot, count: int = per_loop, errors: list[BaseException] = errors
        ) -> None:
            try:
                for _ in range(count):
                    slot.run_once()
            except BaseException as exc:  # reported after the join
                errors.append(exc)

        threads = [threading.Thread(target=loop, args=(s,)) for s in slots]
        t0 = time.perf_counter()
        for t in threads:
            t.start()
        for t in threads:
            t.join(timeout=RUN_DEADLINE_SECONDS * per_loop)
        wall = time.perf_counter() - t0
        if errors:
            raise RuntimeError(f"floor parallel loop failed: {errors[0]}")
        result.parallel[loops] = loops * per_loop / wall
    return result


# ---------------------------------------------------------------------------------------
# floom: a real server in a subprocess


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


@dataclass
class CpuPerRun:
    """CPU milliseconds per run: the server process, this bench client, the whole machine."""

    server: float
    client: float
    machine: float

    @property
    def rest(self) -> float:
        """The sandboxed processes, plus anything else running on the machine meanwhile."""
        return self.machine - self.server - self.client


def measure_cpu(pid: int | None, runs: int, fn: Callable[[], Any]) -> tuple[Any, CpuPerRun]:
    def sample() -> tuple[float, float, float]:
        server = proc_cpu_seconds(pid) if pid is not None else 0.0
        return server, own_cpu_seconds(), machine_busy_seconds()

    before = sample()
    value = fn()
    after = sample()
    per = 1000 / max(runs, 1)
    server, client, machine = ((a - b) * per for a, b in zip(after, before, strict=True))
    return value, CpuPerRun(server, client, machine)


def parse_ts(value: str | None) -> datetime | None:
    return datetime.fromisoformat(value) if value else None


def seconds_between(a: str | None, b: str | None) -> float | None:
    start, end = parse_ts(a), parse_ts(b)
    if start is None or end is None:
        return None
    return (end - start).total_seconds()


class Server:
    """`floom serve` on a free loopback port with a fresh data dir."""

    def __init__(
        self, root: Path, database_url: str | None, extra_env: dict[str, str] | None = None
    ) -> None:
        self.port = free_port()
        self.key = "flm_bench_" + secrets.token_urlsafe(24)
        self.base_url = f"http://{HOST}:{self.port}"
        self.log_path = root / "server.log"
        env = {k: v for k, v in os.environ.items() if not k.startswith("FLOOM_")}
        env.update(
            FLOOM_DATA_DIR=str(root / "data"),
            FLOOM_BOOTSTRAP_API_KEY=self.key,
            FLOOM_DEPLOY_EXAMPLES="true",
            FLOOM_HOST=HOST,
            FLOOM_PORT=str(self.port),
        )
        if database_url:
            env["FLOOM_DATABASE_URL"] = database_url
        env.update(extra_env or {})
        if importlib.util.find_spec("floom.cli") is not None:
            argv = [str(VENV_BIN / "floom"), "serve", "--port", str(self.port)]
            self.launcher = "floom serve"
        else:
            # floom.cli is not in this tree yet: serve the same app factory with uvicorn,
            # which is what `floom serve` wraps.
            argv = [sys.executable, "-m", "uvicorn", "floom.api.app:create_app", "--factory"]
            argv += ["--host", HOST, "--port", str(self.port), "--log-level", "warning"]
            self.launcher = "uvicorn floom.api.app:create_app --factory (no floom.cli yet)"
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


def trigger(client: httpx.Client) -> dict[str, Any]:
    resp = client.post("/api/v1/workers/hello/runs", json={"inputs": {"name": "bench"}})
    if resp.status_code != 202:
        raise RuntimeError(f"POST runs answered {resp.status_code}: {resp.text[:300]}")
    body: dict[str, Any] = resp.json()
    return body


def wait_terminal(client: httpx.Client, run_id: str) -> dict[str, Any]:
    deadline = time.monotonic() + RUN_DEADLINE_SECONDS
    while time.monotonic() < deadline:
        body: dict[str, Any] = client.get(f"/api/v1/runs/{run_id}").json()
        if body.get("status") in FINISHED:
            return body
        time.sleep(POLL_SECONDS)
    raise RuntimeError(f"run {run_id} not terminal within {RUN_DEADLINE_SECONDS:g} s")


@dataclass
class LatencyResult:
    label: str
    client: list[float]  # trigger (before POST) to terminal seen (after GET), seconds
    post: list[float]  # the POST's own round trip
    polls: list[int]
    to_start: list[float]  # created_at -> started_at
    start_to_finish: list[float]  # started_at -> finished_at
    server_total: list[float]  # created_at -> finished_at
    sandbox: list[float]  # usage.sandbox_seconds: the executor's time inside sandbox.run
    failed: list[str]
    paired_floor: list[float] = field(default_factory=list)  # a floor run just before each


def warm_up(server: Server) -> float:
    """Two runs not counted (the first unpacks the version); returns the first one's seconds."""
    client = server.client
    t0 = time.perf_counter()
    cold = wait_terminal(client, trigger(client)["id"])
    cold_seconds = time.perf_counter() - t0
    if cold["status"] != SUCCEEDED:
        raise RuntimeError(f"the first run did not succeed: {cold}")
    wait_terminal(client, trigger(client)["id"])
    return cold_seconds


def run_latency(
    server: Server,
    runs: int,
    *,
    label: str,
    head_start: float = 0.0,
    paired: FloorSlot | None = None,
) -> LatencyResult:
    """`runs` sequential runs: POST, then one GET that the server answers when the run ends.

    With `head_start`, the first GET waits that long after the trigger (a run cannot end
    before its sandboxed process does), so polling does not load the 2-core machine while
    the sandbox runs. With `paired`, one floor run precedes each floom run, so both see
    the same machine load.
    """
    client = server.client
    res = LatencyResult(label, [], [], [], [], [], [], [], [])
    for _ in range(runs):
        if paired is not None:
            res.paired_floor.append(paired.run_once())
        t0 = time.perf_counter()
        run_id = trigger(client)["id"]
        t_post = time.perf_counter()
        if head_start > 0:
            time.sleep(max(0.0, head_start - (t_post - t0)))
        polls = 0
        deadline = time.monotonic() + RUN_DEADLINE_SECONDS
        while True:
            # The server holds the GET until the run ends (`?wait=`), so the end is seen as
            # it happens without a stream of polls loading the machine being measured.
            body = client.get(
                f"/api/v1/runs/{run_id}", params={"wait": WAIT_SECONDS}, timeout=WAIT_SECONDS + 10
            ).json()
            polls += 1
            if body.get("status") in FINISHED or time.monotonic() > deadline:
                break
        t_end = time.perf_counter()
        if body.get("status") not in FINISHED:
            raise RuntimeError(f"run {run_id} not terminal within {RUN_DEADLINE_SECONDS:g} s")
        if body["status"] != SUCCEEDED:
            res.failed.append(f"{run_id}: {body['status']} {body.get('error')}")
        res.client.append(t_end - t0)
        res.post.append(t_post - t0)
        res.polls.append(polls)
        for target, a, b in (
            (res.to_start, "created_at", "started_at"),
            (res.start_to_finish, "started_at", "finished_at"),
            (res.server_total, "created_at", "finished_at"),
        ):
            value = seconds_between(body.get(a), body.get(b))
            if value is not None:
                target.append(value)
        res.sandbox.append(float(body.get("usage", {}).get("sandbox_seconds") or 0.0))
    return res


def http_round_trips(server: Server, count: int = 30) -> dict[str, float]:
    """Median seconds of cheap requests on the idle server: the HTTP stack's own cost."""
    client = server.client
    last = client.get("/api/v1/runs", params={"limit": 1}).json()["items"][0]["id"]
    paths = {
        "healthz": "/healthz",
        "run": f"/api/v1/runs/{last}",
        "worker": "/api/v1/workers/hello",
    }
    out = {}
    for name, path in paths.items():
        times = []
        for _ in range(count):
            t0 = time.perf_counter()
            client.get(path).raise_for_status()
            times.append(time.perf_counter() - t0)
        out[name] = median(times)
    return out


def load_average() -> str:
    one, five, fifteen = os.getloadavg()
    return f"{one:.2f} {five:.2f} {fifteen:.2f}"


@dataclass
class ThroughputResult:
    total: int
    clients: int
    enqueue_seconds: float
    client_wall: float  # first POST sent -> all terminal seen
    server_span: float  # first created_at -> last finished_at
    succeeded: int
    statuses: dict[str, int]
    errors: dict[str, int]
    to_start: list[float]
    start_to_finish: list[float]
    ids: list[str]


def check_logs(server: Server, ids: list[str]) -> tuple[int, int]:
    """Runs whose log lacks the script's line, and runs where it comes after the final status."""
    missing = late = 0
    for run_id in ids:
        items = server.client.get(f"/api/v1/runs/{run_id}/logs", params={"limit": 100}).json()
        items = items["items"]
        greeting = [e["seq"] for e in items if e["stream"] == "stdout"]
        final = [  # the executor's last event: "succeeded", or "failed: why", ...
            e["seq"]
            for e in items
            if e["stream"] == "system" and e["line"].split(":", 1)[0] in FINISHED
        ]
        if not greeting:
            missing += 1
        elif final and min(final) < greeting[0]:
            late += 1
    return missing, late


def list_runs_by_id(client: httpx.Client, ids: set[str]) -> dict[str, dict[str, Any]]:
    """The runs among `ids`, read newest first in pages of 500 until past the oldest id."""
    oldest = min(ids)
    found: dict[str, dict[str, Any]] = {}
    cursor: str | None = None
    for _ in range(1 + len(ids) // 100):  # bounded paging
        params: dict[str, Any] = {"worker": "hello", "limit": 500}
        if cursor:
            params["cursor"] = cursor
        page = client.get("/api/v1/runs", params=params).json()
        for item in page["items"]:
            if item["id"] in ids:
                found[item["id"]] = item
        cursor = page.get("next_cursor")
        if not cursor or not page["items"] or page["items"][-1]["id"] < oldest:
            break
    return found


def run_throughput(server: Server, total: int, clients: int) -> ThroughputResult:
    lock = threading.Lock()
    remaining = [total]
    ids: list[str] = []
    errors: list[BaseException] = []

    def producer() -> None:
        with server.new_client() as client:
            while True:
                with lock:
                    if remaining[0] <= 0:
                        return
                    remaining[0] -= 1
                try:
                    run_id = trigger(client)["id"]
                except BaseException as exc:  # reported after the join
                    errors.append(exc)
                    return
                with lock:
                    ids.append(run_id)

    threads = [threading.Thread(target=producer) for _ in range(clients)]
    t0 = time.perf_counter()
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=THROUGHPUT_DEADLINE_SECONDS)
    enqueue_seconds = time.perf_counter() - t0
    if errors:
        raise RuntimeError(f"queueing runs failed: {errors[0]}")
    wanted = set(ids)
    deadline = time.monotonic() + THROUGHPUT_DEADLINE_SECONDS
    rows: dict[str, dict[str, Any]] = {}
    while time.monotonic() < deadline:
        # Cheap probes while runs drain: listing hundreds of runs costs the server more CPU
        # than the runs it would be measuring.
        if not any(
            server.client.get(
                "/api/v1/runs", params={"worker": "hello", "status": status, "limit": 1}
            ).json()["items"]
            for status in sorted(ACTIVE)
        ):
            rows = list_runs_by_id(server.client, wanted)
            if len(rows) == len(wanted) and all(r["status"] in FINISHED for r in rows.values()):
                break
        time.sleep(0.05)
    client_wall = time.perf_counter() - t0
    statuses: dict[str, int] = {}
    errs: dict[str, int] = {}
    for r in rows.values():
        statuses[r["status"]] = statuses.get(r["status"], 0) + 1
        if r.get("error"):
            code = r["error"].get("code") or "?"
            errs[code] = errs.get(code, 0) + 1
    created = [parse_ts(r["created_at"]) for r in rows.values()]
    finished = [parse_ts(r["finished_at"]) for r in rows.values() if r.get("finished_at")]
    span = (max(finished) - min(c for c in created if c)).total_seconds() if finished else math.nan

    def spans(a: str, b: str) -> list[float]:
        values = (seconds_between(r.get(a), r.get(b)) for r in rows.values())
        return [v for v in values if v is not None]

    return ThroughputResult(
        total=len(wanted),
        clients=clients,
        enqueue_seconds=enqueue_seconds,
        client_wall=client_wall,
        server_span=span,
        succeeded=statuses.get(SUCCEEDED, 0),
        statuses=statuses,
        errors=errs,
        to_start=spans("created_at", "started_at"),
        start_to_finish=spans("started_at", "finished_at"),
        ids=sorted(wanted),
    )


# ---------------------------------------------------------------------------------------
# reporting


def median(values: Iterable[float]) -> float:
    data = list(values)
    return statistics.median(data) if data else math.nan


def pct(values: Iterable[float], q: float) -> float:
    """Nearest-rank percentile."""
    data = sorted(values)
    if not data:
        return math.nan
    return data[max(0, math.ceil(q / 100 * len(data)) - 1)]


def ms(seconds: float) -> str:
    return "n/a" if math.isnan(seconds) else f"{seconds * 1000:.1f} ms"


def verdict(ok: bool) -> str:
    return "OK" if ok else "MISS"


def print_table(rows: list[tuple[str, ...]]) -> None:
    header = ("metric", "floor", "floom", "ratio/overhead", "target", "verdict")
    widths = [max(len(r[i]) for r in (header, *rows)) for i in range(len(header))]
    line = "  ".join("-" * w for w in widths)
    print("  ".join(h.ljust(w) for h, w in zip(header, widths, strict=True)))
    print(line)
    for r in rows:
        print("  ".join(c.ljust(w) for c, w in zip(r, widths, strict=True)))


def section(title: str) -> None:
    print(f"\n== {title}", flush=True)


def stage(label: str, fn: Callable[[], Any]) -> Any:
    t0 = time.perf_counter()
    print(f"   {label} ...", end="", flush=True)
    value = fn()
    print(f" {time.perf_counter() - t0:.1f} s", flush=True)
    return value


def overhead_row(
    metric: str, floor_s: float, floom_s: float, *, target: bool = False
) -> tuple[str, ...]:
    over = (floom_s - floor_s) * 1000
    ratio = f"{over:+.1f} ms ({floom_s / floor_s:.2f}x)"
    if not target:
        return (metric, ms(floor_s), ms(floom_s), ratio, "-", "-")
    return (
        metric,
        ms(floor_s),
        ms(floom_s),
        ratio,
        f"overhead < {OVERHEAD_TARGET_MS:g} ms",
        verdict(over < OVERHEAD_TARGET_MS),
    )


def print_latency(res: LatencyResult) -> None:
    tag = f"[{res.label}]"
    print(
        f"   {tag} client trigger -> terminal seen: median {ms(median(res.client))}, "
        f"p90 {ms(pct(res.client, 90))}; POST round trip {ms(median(res.post))}; "
        f"GETs per run {median(res.polls):g}"
    )
    rest = [a - b for a, b in zip(res.start_to_finish, res.sandbox, strict=True)]
    seen = [c - t for c, t in zip(res.client, res.server_total, strict=True)]
    print(
        f"   {tag} server created -> finished {ms(median(res.server_total))} = "
        f"created -> started {ms(median(res.to_start))} + sandbox.run "
        f"{ms(median(res.sandbox))} + rest of the attempt {ms(median(rest))}; "
        f"client time outside that span {ms(median(seen))}"
    )
    if res.paired_floor:
        print(
            f"   {tag} paired floor runs (one before each floom run): median "
            f"{ms(median(res.paired_floor))}, p90 {ms(pct(res.paired_floor, 90))}"
        )
    if res.failed:
        print(f"   {tag} FAILED runs: {len(res.failed)}; first: {res.failed[0]}")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=50, help="N sequential runs (default 50)")
    parser.add_argument(
        "--throughput-runs", type=int, default=200, help="M runs queued at once (default 200)"
    )
    parser.add_argument("--clients", type=int, default=4, help="threads queueing the M runs")
    parser.add_argument("--database-url", default=None, help="FLOOM_DATABASE_URL for the server")
    parser.add_argument("--keep", action="store_true", help="keep the temp dir (server log)")
    args = parser.parse_args(argv)
    if not 1 <= args.runs <= 1000 or not 1 <= args.throughput_runs <= 2000:
        parser.error("--runs must be 1..1000 and --throughput-runs 1..2000")
    if not 1 <= args.clients <= 16:
        parser.error("--clients must be 1..16")

    bench_start = time.perf_counter()
    cores = os.cpu_count() or 1
    root = Path(tempfile.mkdtemp(prefix="floom-bench-"))
    print(
        f"floom run benchmark: N={args.runs}, M={args.throughput_runs}, cores={cores}, "
        f"kernel {platform.release()}, client python {platform.python_version()}, "
        f"load average {load_average()}"
    )
    try:
        section("floor: prlimit + bwrap + python3 run.py (plain subprocess.run)")
        floor = stage("sequential and parallel runs", lambda: run_floor(args.runs, root / "floor"))
        print(f"   command line: {floor.argv_check}")
        print(f"   sandboxed interpreter: {floor.python}")
        print(
            f"   per run: median {ms(median(floor.latencies))}, "
            f"p90 {ms(pct(floor.latencies, 90))}, min {ms(min(floor.latencies))}, "
            f"max {ms(max(floor.latencies))}"
        )
        print(
            f"   CPU per run: sandboxed processes {floor.cpu.rest:.1f} ms (machine-wide, so "
            f"it includes other load), bench client {floor.cpu.client:.1f} ms"
        )
        for loops, rate in floor.parallel.items():
            print(f"   {loops} parallel loops: {rate:.1f} runs/s")

        section("floom: a real server")
        (root / "srv").mkdir()
        server = Server(root / "srv", args.database_url)
        try:
            print(f"   launcher: {server.launcher} on {server.base_url} (pid {server.proc.pid})")
            stage("waiting for /healthz", server.wait_ready)
            health = server.client.get("/healthz").json()
            worker = server.client.get("/api/v1/workers/hello")
            if worker.status_code == 401:
                raise RuntimeError(
                    "the bootstrap API key was refused: the database already has an admin key; "
                    "give --database-url an empty database"
                )
            if worker.status_code != 200:
                raise RuntimeError(f"example worker hello not deployed: {worker.text[:300]}")
            print(
                f"   ready in {server.ready_seconds:.2f} s; database {health.get('database')}, "
                f"executor {health.get('executor')}; worker hello is deployed"
            )
            idle_cpu0, idle_t0 = proc_cpu_seconds(server.proc.pid), time.perf_counter()
            time.sleep(IDLE_SECONDS)
            idle_cpu = (proc_cpu_seconds(server.proc.pid) - idle_cpu0) / (
                time.perf_counter() - idle_t0
            )
            idle_rss, idle_kids = tree_rss_mb(server.proc.pid)
            print(
                f"   idle: RSS {idle_rss:.1f} MiB ({idle_kids} child processes), "
                f"CPU {idle_cpu * 100:.1f}% of a core over {IDLE_SECONDS:g} s"
            )

            cold = warm_up(server)
            lat_a, cpu_a = stage(
                f"latency A: {args.runs} runs, GET every 2 ms from the trigger",
                lambda: measure_cpu(
                    server.proc.pid,
                    args.runs,
                    lambda: run_latency(server, args.runs, label="A"),
                ),
            )
            head_start = HEAD_START_FRACTION * min(floor.latencies)
            paired = FloorSlot(root / "paired", 0, floor.prefix)
            lat_b, cpu_b = stage(
                f"latency B: {args.runs} runs, GET every 2 ms after {head_start * 1000:.0f} ms, "
                "each paired with a floor run",
                lambda: measure_cpu(
                    server.proc.pid,
                    args.runs,
                    lambda: run_latency(
                        server, args.runs, label="B", head_start=head_start, paired=paired
                    ),
                ),
            )
            idle_http = stage("idle HTTP round trips", lambda: http_round_trips(server))
            thr, cpu_t = stage(
                f"throughput: {args.throughput_runs} runs from {args.clients} clients",
                lambda: measure_cpu(
                    server.proc.pid,
                    args.throughput_runs,
                    lambda: run_throughput(server, args.throughput_runs, args.clients),
                ),
            )
            log_missing, log_late = stage(
                "reading the logs of the throughput runs", lambda: check_logs(server, thr.ids)
            )
            time.sleep(1.0)
            load_rss, load_kids = tree_rss_mb(server.proc.pid)
            peak_rss = rss_kib(server.proc.pid, "VmHWM") / 1024
        finally:
            stop_how, stop_seconds = server.stop()
        print(f"   server stop: {stop_how} in {stop_seconds:.2f} s")

        floor_med, floor_p90 = median(floor.latencies), pct(floor.latencies, 90)
        rate = thr.total / thr.server_span if thr.server_span > 0 else math.nan

        section("floom latency (sequential runs; medians unless stated)")
        print(f"   first (cold) run, trigger to finish: {ms(cold)} (not counted)")
        print_latency(lat_a)
        print_latency(lat_b)
        print(
            "   (rest of the attempt: load the version, copy its files, judge result.json, "
            "flush logs, record the finish; created_at and finished_at are stamped before "
            "their commits, so the POST and the finish commit fall in the client time)"
        )
        print(
            f"   idle HTTP round trips: GET /healthz {ms(idle_http['healthz'])}, "
            f"GET /api/v1/runs/{{id}} {ms(idle_http['run'])}, "
            f"GET /api/v1/workers/hello {ms(idle_http['worker'])}"
        )
        for tag, cpu in (("A", cpu_a), ("B", cpu_b)):
            print(
                f"   [{tag}] CPU per run: server {cpu.server:.1f} ms, bench client "
                f"{cpu.client:.1f} ms, whole machine {cpu.machine:.1f} ms"
                + (" (B includes its paired floor run)" if tag == "B" else "")
            )

        section("floom throughput")
        print(
            f"   queued {thr.total} runs in {thr.enqueue_seconds:.2f} s "
            f"({thr.total / thr.enqueue_seconds:.0f} POSTs/s from {thr.clients} clients, "
            "while the executor was already running them)"
        )
        print(f"   first created -> last finished: {thr.server_span:.2f} s = {rate:.1f} runs/s")
        print(
            f"   first POST -> all terminal seen: {thr.client_wall:.2f} s = "
            f"{thr.total / thr.client_wall:.1f} runs/s"
        )
        print(f"   statuses: {thr.statuses}" + (f"; errors: {thr.errors}" if thr.errors else ""))
        print(
            f"   logs: {log_missing} run(s) without the script's output line, {log_late} with it "
            "stored after the run's final status event"
        )
        print(
            f"   per run under load: created -> started median {ms(median(thr.to_start))} "
            f"(p90 {ms(pct(thr.to_start, 90))}); started -> finished median "
            f"{ms(median(thr.start_to_finish))} (p90 {ms(pct(thr.start_to_finish, 90))})"
        )
        sandbox_ms = floor.cpu.rest
        print(
            f"   CPU per run: server {cpu_t.server:.1f} ms, bench client {cpu_t.client:.1f} ms, "
            f"sandboxes and anything else on the machine {cpu_t.rest:.1f} ms"
        )
        print(
            f"   CPU-bound ceiling on {cores} cores, from the floor's {sandbox_ms:.1f} ms per "
            f"sandboxed run: {cores * 1000 / sandbox_ms:.1f} runs/s bare, "
            f"{cores * 1000 / (sandbox_ms + cpu_t.server):.1f} runs/s adding floom's server CPU"
        )
        print(
            f"   RSS after load: {load_rss:.1f} MiB ({load_kids} child processes); "
            f"peak (VmHWM) {peak_rss:.1f} MiB"
        )
        load_at_end = os.getloadavg()[0]
        print(f"   load average at the end: {load_average()}")

        best_floor = max(floor.parallel.values())
        rows = [
            overhead_row(
                "A trigger-to-finish median", floor_med, median(lat_a.client), target=True
            ),
            overhead_row("A trigger-to-finish p90", floor_p90, pct(lat_a.client, 90)),
            overhead_row("B trigger-to-finish median", floor_med, median(lat_b.client)),
            overhead_row(
                "B vs its paired floor",
                median(lat_b.paired_floor),
                median(lat_b.client),
                target=True,
            ),
            overhead_row("B created->finished", floor_med, median(lat_b.server_total)),
            ("trigger-to-start median", "-", ms(median(lat_a.to_start)), "-", "-", "-"),
            (
                "floor per run",
                ms(floor_med),
                "-",
                f"{floor_med * 1000 / FLOOR_REFERENCE_MS:.2f}x ref",
                f"about {FLOOR_REFERENCE_MS:g} ms",
                "ref",
            ),
            (
                "throughput runs/s",
                f"{floor.parallel[2]:.1f} (2) / {floor.parallel[4]:.1f} (4)",
                f"{rate:.1f}",
                f"{rate / best_floor:.2f}x best floor",
                f">= {THROUGHPUT_TARGET:g}/s",
                verdict(rate >= THROUGHPUT_TARGET),
            ),
            (
                "throughput succeeded",
                "-",
                f"{thr.succeeded}/{args.throughput_runs}",
                "-",
                "all",
                verdict(thr.succeeded == args.throughput_runs),
            ),
            (
                "throughput logs intact",
                "-",
                f"{thr.total - log_missing - log_late}/{thr.total}",
                f"{log_missing} missing, {log_late} out of order",
                "all",
                verdict(log_missing == 0 and log_late == 0),
            ),
            (
                "RSS idle",
                "-",
                f"{idle_rss:.1f} MiB",
                "-",
                f"< {IDLE_RSS_TARGET_MB:g} MB",
                verdict(idle_rss < IDLE_RSS_TARGET_MB),
            ),
            ("RSS after load", "-", f"{load_rss:.1f} MiB", "-", "-", "-"),
        ]
        section("summary")
        print_table(rows)
        busy = [
            why
            for why, bad in (
                (f"load average {load_average()} on {cores} cores", load_at_end > cores / 2),
                (
                    f"floor median {ms(floor_med)} against about {FLOOR_REFERENCE_MS:g} ms",
                    floor_med * 1000 > 1.5 * FLOOR_REFERENCE_MS,
                ),
            )
            if bad
        ]
        if busy:
            print(
                f"\nWARNING: the machine was busy ({'; '.join(busy)}): figures taken at "
                "different moments are not comparable; trust 'B vs its paired floor' most"
            )
        print(f"\nbench took {time.perf_counter() - bench_start:.1f} s")
        return 0
    finally:
        if args.keep:
            print(f"kept {root}")
        else:
            shutil.rmtree(root, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
