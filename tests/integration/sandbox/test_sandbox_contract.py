"""The Sandbox contract (floom/sandbox/base.py), one suite over every backend.

Each behaviour is written twice, once as the Python script a real backend runs and once as
the program the in-memory fake runs, and must come out the same on every backend. The E2B
backend runs the real SDK against the wire-level stand-in (tests/standins/e2b); `local-warm`
is the local backend with every Python run started from a warm process (tests/support/rigs/warm.py);
`e2b-warm` the E2B backend with every run started in a sandbox created ahead of it
(FLOOM_E2B_WARM; tests/support/rigs/e2b.py).
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
from floom.sandbox.base import Sandbox, SandboxResult, SandboxSpec, SandboxUnavailable
from floom.sandbox.fake import FakeProcess, FakeProgram, FakeSandbox
from tests.standins.e2b import E2BStandin
from tests.support.rigs.e2b import WarmedE2B, e2b_backend, standin_for_module
from tests.support.rigs.warm import WarmedLocal


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


# The module's E2B stand-in, set by the `backend` fixture when an E2B case runs.
_E2B: list[E2BStandin] = []
# The module's warm local backend (one pool for every case), set by the `backend` fixture.
_WARM: list[WarmedLocal] = []
# The module's E2B backend with sandboxes made ahead (one pool for every case).
_E2B_WARM: list[WarmedE2B] = []

# Each backend by name, built for the programs the fake runs (real backends run run.py).
BACKENDS: dict[str, Callable[[dict[str, FakeProgram]], Sandbox]] = {
    "local": lambda programs: LocalSandbox(),
    "fake": lambda programs: FakeSandbox(programs),
    "e2b": lambda programs: e2b_backend(_E2B[0]),
    "local-warm": lambda programs: _WARM[0],
    "e2b-warm": lambda programs: _E2B_WARM[0],
}
# The backends that run real processes (what reaping orphans is about).
PROCESS_BACKENDS = ["local", "e2b"]


@pytest.fixture(scope="module")
def e2b_service() -> Iterator[E2BStandin]:
    with standin_for_module() as standin:
        yield standin


@pytest.fixture(scope="module")
def warm_local(tmp_path_factory: pytest.TempPathFactory) -> Iterator[WarmedLocal]:
    local = LocalSandbox()
    if local.warm is None:
        pytest.skip("warm starts need floom to run as root")
    warmed = WarmedLocal(local, tmp_path_factory.mktemp("warm-root"))
    yield warmed
    warmed.close()


@pytest.fixture(scope="module")
def e2b_warm(e2b_service: E2BStandin) -> Iterator[WarmedE2B]:
    warmed = WarmedE2B(e2b_backend(e2b_service, e2b_warm=1))
    yield warmed
    warmed.close()


@pytest.fixture(params=list(BACKENDS))
def backend(request: pytest.FixtureRequest) -> str:
    if request.param in ("e2b", "e2b-warm"):
        _E2B[:] = [request.getfixturevalue("e2b_service")]
    if request.param == "e2b-warm":
        _E2B_WARM[:] = [request.getfixturevalue("e2b_warm")]
    if request.param == "local-warm":
        _WARM[:] = [request.getfixturevalue("warm_local")]
    name: str = request.param
    return name


def build(backend: str, programs: dict[str, FakeProgram] | None = None) -> Sandbox:
    return BACKENDS[backend](programs or {})


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
    sandbox = build(backend, {"run.py": case.program})
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
    assert not ran.result.timed_out
    assert not ran.result.cancelled
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
    sandbox = build(backend)
    spec = SandboxSpec(run_id="r", command=[], workdir=tmp_path, output_dir=tmp_path)
    with pytest.raises(InvalidRequest):
        sandbox.run(spec, on_line=lambda s, line: None, should_cancel=lambda: False)


@pytest.mark.parametrize("name", ["NOT-A-NAME", "1ST", "A B", ""])
def test_an_environment_variable_no_shell_could_name_is_refused_before_anything_runs(
    backend: str, tmp_path: Path, name: str
) -> None:
    sandbox = build(backend)
    spec = SandboxSpec(
        run_id="r", command=["true"], workdir=tmp_path, output_dir=tmp_path, env={name: "x"}
    )
    with pytest.raises(InvalidRequest, match="environment variable"):
        sandbox.run(spec, on_line=lambda s, line: None, should_cancel=lambda: False)


@pytest.mark.parametrize(
    "name", ["LD_PRELOAD", "GCONV_PATH", "BASH_ENV", "PATH", "PYTHONPATH", "FLOOM_SANDBOX_FOR"]
)
def test_a_variable_that_changes_how_programs_load_or_run_is_refused_before_anything_runs(
    backend: str, tmp_path: Path, name: str
) -> None:
    # The last line of floom/sandbox/env_names.py's rule, behind secrets set and worker.yml.
    sandbox = build(backend)
    spec = SandboxSpec(
        run_id="r",
        command=["true"],
        workdir=tmp_path,
        output_dir=tmp_path,
        env={"FLOOM_RUN_ID": "r", name: str(tmp_path / "lib.so")},
    )
    with pytest.raises(InvalidRequest, match=f"{name} is refused"):
        sandbox.run(spec, on_line=lambda s, line: None, should_cancel=lambda: False)


@pytest.mark.parametrize(
    "env",
    [{"BIG": "x" * (128 * 1024)}, {f"PART_{i}": "x" * (100 * 1024) for i in range(12)}],
    ids=["one variable", "all of them"],
)
def test_an_environment_no_process_could_start_with_is_refused_before_anything_runs(
    backend: str, tmp_path: Path, env: dict[str, str]
) -> None:
    sandbox = build(backend)
    spec = SandboxSpec(run_id="r", command=["true"], workdir=tmp_path, output_dir=tmp_path, env=env)
    with pytest.raises(InvalidRequest, match="bytes"):
        sandbox.run(spec, on_line=lambda s, line: None, should_cancel=lambda: False)


# -- sessions: several commands in one workspace ----------------------------------------------


def _step_write(p: FakeProcess) -> int:
    p.write("notes/first.txt", "from the first command")
    p.write_output("partial.txt", "kept")
    return 0


def _step_read(p: FakeProcess) -> int:
    for name in ("notes/first.txt", "from_host.txt"):
        p.print((p.spec.workdir / name).read_text())
    p.write("result.json", json.dumps({"outputs": {"steps": 2}}))
    return 0


SESSION_STEPS = {
    "write.py": Case(
        "import os\n"
        "os.makedirs('notes', exist_ok=True)\n"
        "open('notes/first.txt', 'w').write('from the first command')\n"
        "open(os.path.join(os.environ['FLOOM_OUTPUT_DIR'], 'partial.txt'), 'w').write('kept')\n",
        _step_write,
    ),
    "read.py": Case(
        "import json\n"
        "for name in ('notes/first.txt', 'from_host.txt'):\n"
        "    print(open(name).read(), flush=True)\n"
        "json.dump({'outputs': {'steps': 2}}, open('result.json', 'w'))\n",
        _step_read,
    ),
}


def session_spec(tmp_path: Path, script: str, **fields: object) -> SandboxSpec:
    return SandboxSpec(
        run_id="run_session",
        command=["python3", script],
        workdir=tmp_path / "work",
        output_dir=tmp_path / "output",
        **{"timeout_seconds": 20.0, **fields},  # type: ignore[arg-type]
    )


def open_workspace(backend: str, tmp_path: Path) -> Sandbox:
    (tmp_path / "work").mkdir()
    (tmp_path / "output").mkdir()
    for name, case in SESSION_STEPS.items():
        (tmp_path / "work" / name).write_text(case.source)
    return build(backend, {name: case.program for name, case in SESSION_STEPS.items()})


def test_a_session_keeps_files_between_commands_and_sees_what_the_host_wrote(
    backend: str, tmp_path: Path
) -> None:
    sandbox = open_workspace(backend, tmp_path)
    lines: list[tuple[str, str]] = []
    with sandbox.open_session() as session:
        first = session.run(
            session_spec(tmp_path, "write.py"),
            on_line=lambda *line: lines.append(line),
            should_cancel=lambda: False,
        )
        assert first.exit_code == 0
        # What the command left is in the host paths before the next command runs ...
        assert (tmp_path / "work/notes/first.txt").read_text() == "from the first command"
        assert (tmp_path / "output/partial.txt").read_text() == "kept"
        # ... and what the host writes in between (an agent's write_file) reaches it.
        (tmp_path / "work/from_host.txt").write_text("written on the host")
        second = session.run(
            session_spec(tmp_path, "read.py"),
            on_line=lambda *line: lines.append(line),
            should_cancel=lambda: False,
        )
    assert second.exit_code == 0, lines
    assert [line for _, line in lines] == ["from the first command", "written on the host"]
    assert json.loads((tmp_path / "work/result.json").read_text()) == {"outputs": {"steps": 2}}


def test_a_timed_out_command_ends_but_the_session_runs_the_next(
    backend: str, tmp_path: Path
) -> None:
    sandbox = open_workspace(backend, tmp_path)
    (tmp_path / "work/run.py").write_text(SLEEPER.source)
    if isinstance(sandbox, FakeSandbox):
        sandbox.programs["run.py"] = SLEEPER.program
    with sandbox.open_session() as session:
        slow = session.run(
            session_spec(tmp_path, "run.py", timeout_seconds=1.0),
            on_line=lambda *line: None,
            should_cancel=lambda: False,
        )
        after = session.run(
            session_spec(tmp_path, "write.py"),
            on_line=lambda *line: None,
            should_cancel=lambda: False,
        )
    assert slow.timed_out
    assert slow.exit_code is None
    assert after.exit_code == 0


def test_a_session_serves_one_workspace_and_nothing_after_close(
    backend: str, tmp_path: Path
) -> None:
    sandbox = open_workspace(backend, tmp_path)
    session = sandbox.open_session()
    session.run(
        session_spec(tmp_path, "write.py"), on_line=lambda *line: None, should_cancel=lambda: False
    )
    other = SandboxSpec(run_id="run_other", command=["true"], workdir=tmp_path, output_dir=tmp_path)
    with pytest.raises(InvalidRequest):
        session.run(other, on_line=lambda *line: None, should_cancel=lambda: False)
    session.close()
    session.close()  # idempotent
    with pytest.raises(InvalidRequest):
        session.run(
            session_spec(tmp_path, "write.py"),
            on_line=lambda *line: None,
            should_cancel=lambda: False,
        )


# -- orphans -----------------------------------------------------------------------------------


@pytest.fixture(params=PROCESS_BACKENDS)
def process_backend(request: pytest.FixtureRequest) -> str:
    if request.param == "e2b":
        _E2B[:] = [request.getfixturevalue("e2b_service")]
    name: str = request.param
    return name


def test_reaping_kills_the_sandboxes_of_runs_no_longer_live_and_spares_the_live_ones(
    process_backend: str, tmp_path: Path
) -> None:
    work_root = tmp_path / "runs"
    sandbox = build(process_backend)
    started = {name: threading.Event() for name in ("run_live", "run_gone")}
    results: dict[str, SandboxResult | Exception] = {}

    def start(run_id: str) -> threading.Thread:
        base = work_root / f"{run_id}-1"
        (base / "work").mkdir(parents=True)
        (base / "output").mkdir()
        (base / "work/run.py").write_text(SLEEPER.source)
        spec = SandboxSpec(
            run_id=run_id,
            command=["python3", "run.py"],
            workdir=base / "work",
            output_dir=base / "output",
            timeout_seconds=60.0,
            metadata={"floom_run_id": run_id, "floom_node": "node-a"},
        )
        stop = threading.Event()
        stops.append(stop)

        def target() -> None:
            try:
                results[run_id] = sandbox.run(
                    spec, on_line=lambda *line: started[run_id].set(), should_cancel=stop.is_set
                )
            except SandboxUnavailable as exc:  # a remote sandbox gone under its command
                results[run_id] = exc

        thread = threading.Thread(target=target)
        thread.start()
        return thread

    stops: list[threading.Event] = []
    threads = [start(run_id) for run_id in started]
    try:
        for event in started.values():
            assert event.wait(20)
        killed = sandbox.reap_orphans(
            node_id="node-a", work_root=work_root, live_run_ids=lambda: {"run_live"}
        )
        threads[1].join(20)
        assert killed >= 1
        gone = results["run_gone"]
        assert isinstance(gone, SandboxUnavailable) or (
            isinstance(gone, SandboxResult) and gone.exit_code != 0
        )
        assert threads[0].is_alive()  # the live run's sandbox still runs
    finally:
        for stop in stops:
            stop.set()
        for thread in threads:
            thread.join(20)
    live = results["run_live"]
    assert isinstance(live, SandboxResult)
    assert live.cancelled


TAMPER = (
    "import json, os\n"
    "tried = {}\n"
    "for what, act in (\n"
    "    ('write', lambda: open('given.json', 'w').write('changed')),\n"
    "    ('chmod', lambda: os.chmod('given.json', 0o666)),\n"
    "    ('rename', lambda: os.rename('given.json', 'moved.json')),\n"
    "    ('remove', lambda: os.remove('given.json')),\n"
    "):\n"
    "    try:\n"
    "        act()\n"
    "        tried[what] = 'done'\n"
    "    except OSError:\n"
    "        tried[what] = 'refused'\n"
    "json.dump({'tried': tried, 'read': open('given.json').read()}, open('result.json', 'w'))\n"
)


@pytest.mark.parametrize("backend", ["local", "local-warm"], indirect=True)
def test_a_read_only_file_of_the_work_dir_cannot_be_changed_and_stays_readable(
    backend: str, tmp_path: Path
) -> None:
    workdir, output_dir = tmp_path / "work", tmp_path / "output"
    workdir.mkdir()
    output_dir.mkdir()
    (workdir / "run.py").write_text(TAMPER)
    (workdir / "given.json").write_text('{"count": 1}')
    spec = SandboxSpec(
        run_id="run_contract",
        command=["python3", "run.py"],
        workdir=workdir,
        output_dir=output_dir,
        timeout_seconds=20,
        read_only=("given.json", "missing.json", "../run.py"),
    )
    result = build(backend).run(spec, on_line=lambda *_: None, should_cancel=lambda: False)
    assert result.exit_code == 0, result
    report = json.loads((workdir / "result.json").read_text())
    assert report == {
        "tried": dict.fromkeys(("write", "chmod", "rename", "remove"), "refused"),
        "read": '{"count": 1}',
    }
    assert (workdir / "given.json").read_text() == '{"count": 1}'
