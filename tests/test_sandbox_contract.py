"""The Sandbox contract (floom/sandbox/base.py), one suite over every backend.

Each behaviour is written twice, once as the Python script a real backend runs and once as
the program the in-memory fake runs, and must come out the same on both.
"""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from floom.errors import InvalidRequest
from floom.sandbox import LocalSandbox
from floom.sandbox.base import Sandbox, SandboxResult, SandboxSpec
from floom.sandbox.fake import FakeProcess, FakeProgram, FakeSandbox


@dataclass(frozen=True)
class Case:
    source: str  # run.py for a real backend
    program: FakeProgram  # the same behaviour for the fake


@dataclass
class Ran:
    result: SandboxResult
    lines: list[tuple[str, str]]
    workdir: Path
    output_dir: Path
    seconds: float


@pytest.fixture(params=["local", "fake"])
def backend(request: pytest.FixtureRequest) -> Iterator[str]:
    yield request.param


def run_case(
    backend: str,
    case: Case,
    tmp_path: Path,
    *,
    env: dict[str, str] | None = None,
    timeout: float = 20.0,
    should_cancel: Callable[[], bool] = lambda: False,
) -> Ran:
    workdir, output_dir = tmp_path / "work", tmp_path / "output"
    workdir.mkdir()
    output_dir.mkdir()
    (workdir / "run.py").write_text(case.source)
    sandbox: Sandbox = (
        LocalSandbox() if backend == "local" else FakeSandbox({"run.py": case.program})
    )
    spec = SandboxSpec(
        run_id="run_contract",
        command=["python3", "run.py"],
        workdir=workdir,
        output_dir=output_dir,
        env=env or {},
        timeout_seconds=timeout,
    )
    lines: list[tuple[str, str]] = []
    started = time.monotonic()
    result = sandbox.run(
        spec, on_line=lambda stream, line: lines.append((stream, line)), should_cancel=should_cancel
    )
    return Ran(result, lines, workdir, output_dir, time.monotonic() - started)


def _lines_in_order(p: FakeProcess) -> int:
    for i in range(3):
        p.print(f"out {i}")
        p.print(f"err {i}", stream="stderr")
    return 0


LINES = Case(
    "import sys\n"
    "for i in range(3):\n"
    "    print(f'out {i}', flush=True)\n"
    "    print(f'err {i}', file=sys.stderr, flush=True)\n",
    _lines_in_order,
)


def test_lines_arrive_in_order_per_stream_and_exit_zero_is_success(
    backend: str, tmp_path: Path
) -> None:
    ran = run_case(backend, LINES, tmp_path)
    assert ran.result == SandboxResult(exit_code=0)
    assert [line for stream, line in ran.lines if stream == "stdout"] == ["out 0", "out 1", "out 2"]
    assert [line for stream, line in ran.lines if stream == "stderr"] == ["err 0", "err 1", "err 2"]


def _exit_three(p: FakeProcess) -> int:
    p.print("failing", stream="stderr")
    return 3


def test_a_failing_process_is_a_result_not_an_exception(backend: str, tmp_path: Path) -> None:
    case = Case("import sys\nprint('failing', file=sys.stderr)\nsys.exit(3)\n", _exit_three)
    ran = run_case(backend, case, tmp_path)
    assert ran.result.exit_code == 3
    assert not ran.result.timed_out and not ran.result.cancelled
    assert ("stderr", "failing") in ran.lines


def _print_env(p: FakeProcess) -> int:
    p.print(json.dumps({k: p.env.get(k) for k in ("GIVEN", "FLOOM_OUTPUT_DIR", "HOST_ONLY")}))
    return 0


def test_the_process_sees_its_declared_environment_and_nothing_of_the_hosts(
    backend: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("HOST_ONLY", "leaked")
    case = Case(
        "import json, os\n"
        "print(json.dumps({k: os.environ.get(k) for k in "
        "('GIVEN', 'FLOOM_OUTPUT_DIR', 'HOST_ONLY')}))\n",
        _print_env,
    )
    ran = run_case(backend, case, tmp_path, env={"GIVEN": "yes"})
    seen = json.loads(ran.lines[0][1])
    assert seen["GIVEN"] == "yes"
    assert seen["HOST_ONLY"] is None
    assert seen["FLOOM_OUTPUT_DIR"]  # where the backend mounts the output dir


def _files(p: FakeProcess) -> int:
    p.write("result.json", json.dumps({"outputs": {"n": 1}}))
    p.write_output("report.txt", "hello")
    return 0


def test_files_the_process_writes_are_in_the_host_paths_when_run_returns(
    backend: str, tmp_path: Path
) -> None:
    case = Case(
        "import json, os\n"
        "json.dump({'outputs': {'n': 1}}, open('result.json', 'w'))\n"
        "open(os.path.join(os.environ['FLOOM_OUTPUT_DIR'], 'report.txt'), 'w').write('hello')\n",
        _files,
    )
    ran = run_case(backend, case, tmp_path)
    assert ran.result.exit_code == 0
    assert json.loads((ran.workdir / "result.json").read_text()) == {"outputs": {"n": 1}}
    assert (ran.output_dir / "report.txt").read_text() == "hello"


def _sleep_forever(p: FakeProcess) -> int:
    p.print("started")
    p.sleep(3600)
    return 0


SLEEPER = Case("import time\nprint('started', flush=True)\ntime.sleep(3600)\n", _sleep_forever)


def test_the_timeout_ends_the_process_and_says_so(backend: str, tmp_path: Path) -> None:
    ran = run_case(backend, SLEEPER, tmp_path, timeout=1.0)
    assert ran.result.timed_out
    assert ran.result.exit_code is None
    assert ran.seconds < 15


def test_a_cancel_ends_the_process_within_the_poll_interval(backend: str, tmp_path: Path) -> None:
    cancel = threading.Event()
    timer = threading.Timer(0.8, cancel.set)
    timer.start()
    try:
        ran = run_case(backend, SLEEPER, tmp_path, should_cancel=cancel.is_set)
    finally:
        timer.cancel()
    assert ran.result.cancelled
    assert ran.result.exit_code is None
    assert ran.seconds < 10


def test_a_spec_without_a_command_is_refused_before_anything_runs(
    backend: str, tmp_path: Path
) -> None:
    sandbox: Sandbox = LocalSandbox() if backend == "local" else FakeSandbox()
    spec = SandboxSpec(run_id="r", command=[], workdir=tmp_path, output_dir=tmp_path)
    with pytest.raises(InvalidRequest):
        sandbox.run(spec, on_line=lambda s, line: None, should_cancel=lambda: False)
