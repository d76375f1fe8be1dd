"""The lease watchdog ends an attempt's sandbox when its lease deadline passes, whatever
floom's own process is doing then (stopped, killed, or busy), and a renewed deadline keeps
it running. A real process in a real run cgroup, and the real local sandbox."""

from __future__ import annotations

import os
import secrets
import signal
import subprocess
import sys
import textwrap
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from floom.sandbox import watchdog as watchdog_program
from floom.sandbox.base import SandboxSpec
from floom.sandbox.fence import WATCHDOG_PROGRAM, LeaseFence, lease_clock, node_fence
from floom.sandbox.local import cgroups
from floom.sandbox.local.backend import LocalSandbox
from tests.support.harness import wait_until

pytestmark = pytest.mark.skipif(
    not cgroups.detect().enforced, reason="needs a writable cgroup tree (root)"
)


@pytest.fixture
def victim() -> Iterator[tuple[subprocess.Popen[bytes], list[str]]]:
    """A sleeping process alone in a run cgroup, and the cgroup's targets for the watchdog."""
    group = cgroups.detect().make(f"run-{secrets.token_hex(8)}")
    proc = subprocess.Popen(["sleep", "300"], start_new_session=True)
    try:
        group.add(proc.pid)
        targets = [f"cgroup:{path}" for path in dict.fromkeys(group.dirs.values())]
        yield proc, targets
    finally:
        proc.kill()
        proc.wait()
        group.remove()


@pytest.fixture
def fence() -> Iterator[LeaseFence]:
    fence = LeaseFence()
    yield fence
    fence.close()


def _key() -> str:
    return f"run_{secrets.token_hex(8)}.1"


def test_the_watchdog_kills_a_sandbox_s_cgroup_when_its_deadline_passes(
    fence: LeaseFence, victim: tuple[subprocess.Popen[bytes], list[str]]
) -> None:
    proc, targets = victim
    key = _key()
    deadline = lease_clock() + 0.5
    assert fence.arm(key, deadline)
    fence.watch(key, targets)
    proc.wait(timeout=30)  # bounded; how soon after the deadline is bench material
    assert proc.returncode == -signal.SIGKILL
    # Never before its deadline (a late look at the clock only adds to the time read).
    assert lease_clock() >= deadline
    assert fence.lapsed(key)
    # Lapsed for good: a renewal committed afterwards moves nothing.
    assert not fence.arm(key, lease_clock() + 60)


def test_a_deadline_moved_on_by_each_renewal_keeps_the_sandbox_running(
    fence: LeaseFence, victim: tuple[subprocess.Popen[bytes], list[str]]
) -> None:
    proc, targets = victim
    key = _key()
    # Each deadline lies 3 s ahead and is moved on every 0.1 s, for longer than one lease:
    # only a renewal stalled for 3 s (not a busy machine's usual lag) lets it pass.
    fence.arm(key, lease_clock() + 3.0)
    fence.watch(key, targets)
    until = time.monotonic() + 3.5
    while time.monotonic() < until:
        last = lease_clock() + 3.0
        assert fence.arm(key, last)
        time.sleep(0.1)
    assert proc.poll() is None
    fence.unwatch(key, targets)
    fence.forget(key)
    wait_until(lambda: lease_clock() > last + 0.5, timeout=10)
    assert proc.poll() is None  # an attempt that ended leaves nothing to kill


def test_a_sandbox_watched_after_its_deadline_passed_is_killed_at_once(
    fence: LeaseFence, victim: tuple[subprocess.Popen[bytes], list[str]]
) -> None:
    proc, targets = victim
    key = _key()
    fence.arm(key, lease_clock() + 0.1)
    wait_until(lambda: fence.lapsed(key), timeout=5)
    time.sleep(0.2)  # the watchdog has fired the key
    fence.watch(key, targets)
    proc.wait(timeout=5)


def test_the_watchdog_is_started_again_with_the_whole_state_when_it_died(
    fence: LeaseFence, victim: tuple[subprocess.Popen[bytes], list[str]]
) -> None:
    proc, targets = victim
    key = _key()
    fence.arm(key, lease_clock() + 1.0)
    fence.watch(key, targets)
    first = fence.watchdog_pid
    assert first is not None
    os.kill(first, signal.SIGKILL)
    wait_until(lambda: not Path(f"/proc/{first}").exists() or _zombie(first), timeout=5)
    # The next change finds it gone, starts another and hands it every deadline and target.
    assert fence.arm(key, lease_clock() + 1.5)
    assert fence.watchdog_pid not in (None, first)
    proc.wait(timeout=10)


def _full_pipe() -> tuple[int, int]:
    """A pipe nobody reads, filled up: a blocking write to it waits for good."""
    read_fd, write_fd = os.pipe()
    os.set_blocking(write_fd, False)
    try:
        while True:
            os.write(write_fd, b"x" * 65536)
    except BlockingIOError:
        pass
    os.set_blocking(write_fd, True)
    return read_fd, write_fd


def test_a_full_log_does_not_hold_up_the_kill_at_the_deadline(
    victim: tuple[subprocess.Popen[bytes], list[str]],
) -> None:
    """The watchdog writes to floom's stderr, which may be a pipe nobody reads while floom
    is stopped (a shell pipeline, a stalled log collector): the sandbox ends all the same."""
    proc, targets = victim
    read_fd, write_fd = _full_pipe()
    watchdog = subprocess.Popen(
        [sys.executable, "-I", "-S", os.fspath(WATCHDOG_PROGRAM)],
        stdin=subprocess.PIPE,
        stdout=subprocess.DEVNULL,
        stderr=write_fd,
        env={},
        start_new_session=True,
    )
    try:
        assert watchdog.stdin is not None
        key = _key()
        lines = [f"deadline {key} {lease_clock() + 0.2:.6f}"]
        lines += [f"watch {key} {target}" for target in targets]
        watchdog.stdin.write("".join(f"{line}\n" for line in lines).encode())
        watchdog.stdin.flush()
        proc.wait(timeout=30)
        assert proc.returncode == -signal.SIGKILL
    finally:
        watchdog.kill()
        watchdog.wait(timeout=10)
        if watchdog.stdin is not None:
            watchdog.stdin.close()
        os.close(read_fd)
        os.close(write_fd)


def _zombie(pid: int) -> bool:
    try:
        return Path(f"/proc/{pid}/stat").read_text().split(") ")[1].startswith("Z")
    except OSError:
        return True


FROZEN_FLOOM = textwrap.dedent(
    """
    import os, signal, sys, time
    from floom.sandbox.fence import lease_clock, node_fence
    fence = node_fence()
    key, targets, mode = sys.argv[1], sys.argv[2].split(","), sys.argv[3]
    # Stopped: its sandbox ends at the deadline. Killed: at once, long before it.
    fence.arm(key, lease_clock() + (1.0 if mode == "stop" else 300.0))
    fence.watch(key, targets)
    print(fence.watchdog_pid, flush=True)
    sys.stdin.readline()
    if mode == "stop":
        os.killpg(0, signal.SIGSTOP)  # floom's whole process group, as an operator might
    else:
        os.kill(os.getpid(), signal.SIGKILL)
    """
)


@pytest.mark.parametrize("mode", ["stop", "kill"])
def test_a_frozen_or_killed_floom_process_does_not_keep_its_sandbox_alive(
    victim: tuple[subprocess.Popen[bytes], list[str]], mode: str
) -> None:
    proc, targets = victim
    floom = subprocess.Popen(
        [sys.executable, "-c", FROZEN_FLOOM, _key(), ",".join(targets), mode],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        env={**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)},
        start_new_session=True,
    )
    try:
        assert floom.stdout is not None
        assert floom.stdin is not None
        watchdog = int(floom.stdout.readline())
        # Its own session and process group: what stops floom's group does not stop it.
        assert os.getsid(watchdog) == watchdog != os.getsid(floom.pid)
        floom.stdin.write(b"go\n")
        floom.stdin.flush()
        # Killed: at once (nothing will record the run here), not at its deadline 300 s
        # on; stopped: at the deadline, by a watchdog that floom's stop did not stop.
        proc.wait(timeout=60)
        if mode == "stop":
            assert Path(f"/proc/{floom.pid}/stat").read_text().split(") ")[1][0] == "T"
    finally:
        os.killpg(floom.pid, signal.SIGKILL)
        floom.communicate(timeout=30)  # closes its pipes too


def test_the_local_sandbox_is_ended_with_its_lease_while_its_supervisor_waits(
    tmp_path: Path,
) -> None:
    sandbox = LocalSandbox()
    work, output = tmp_path / "work", tmp_path / "output"
    work.mkdir()
    output.mkdir()
    key = _key()
    spec = SandboxSpec(
        run_id=key.split(".")[0],
        command=["sleep", "300"],
        workdir=work,
        output_dir=output,
        timeout_seconds=120,
        fence=key,
    )
    fence = node_fence()
    assert fence.arm(key, lease_clock() + 1.5)
    done = threading.Event()
    try:
        # The supervisor is never asked to cancel, and the sandbox's timeout is far off:
        # only the watchdog ends the sandbox.
        result = sandbox.run(spec, on_line=lambda *_: None, should_cancel=done.is_set)
        assert result.exit_code != 0
        assert not result.timed_out
        assert fence.lapsed(key)
    finally:
        done.set()
        fence.forget(key)
        sandbox.close()


def test_a_sandbox_that_lingers_does_not_hold_up_the_kill_of_another_due_with_it(
    tmp_path: Path,
    victim: tuple[subprocess.Popen[bytes], list[str]],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Two attempts lapse at once; the first one's processes do not go (here: a cgroup that
    keeps listing a zombie, as one stuck in the kernel would): the second's end at once."""
    monkeypatch.setattr(watchdog_program, "_KILL_SECONDS", 300.0)
    zombie = subprocess.Popen(["true"])  # not waited for until the end: a zombie, kept
    stuck = tmp_path / "floom" / f"run-{secrets.token_hex(8)}"
    stuck.mkdir(parents=True)
    (stuck / "cgroup.procs").write_text(f"{zombie.pid}\n")
    proc, targets = victim
    dog = watchdog_program.Watchdog()
    first, second = _key(), _key()
    for key, watched in ((first, [f"cgroup:{stuck}"]), (second, targets)):
        dog.handle(f"deadline {key} {lease_clock():.6f}")
        for target in watched:
            dog.handle(f"watch {key} {target}")
    firing = threading.Thread(target=dog.fire_due, args=(lease_clock() + 1,), daemon=True)
    firing.start()
    try:
        proc.wait(timeout=30)  # before: only after the first's 300 s of tries
        assert proc.returncode == -signal.SIGKILL
        assert firing.is_alive()  # still trying the first
    finally:
        (stuck / "cgroup.procs").write_text("")
        firing.join(timeout=30)
        zombie.wait()
    assert not firing.is_alive()


# A suspend of the host (or a guest's suspend to RAM) stops CLOCK_MONOTONIC while the wall
# clock the database lease is counted on runs on. A real suspend cannot be made here: these
# tests make floom's monotonic clock lag the boot clock by the time a suspend would have
# taken from it, which is what the host's clocks look like after a resume.
SLEPT_SECONDS = 300.0


def _after_a_suspend(monkeypatch: pytest.MonkeyPatch) -> None:
    real = time.monotonic
    monkeypatch.setattr(time, "monotonic", lambda: real() - SLEPT_SECONDS)


class _NoTimer(watchdog_program.DeadlineTimer):
    """As where no timerfd can be made (no ctypes): the watchdog waits in short steps."""

    def __init__(self) -> None:
        super().__init__()
        if self.fd >= 0:
            os.close(self.fd)
        self.fd = -1


@pytest.mark.parametrize("timer", ["timerfd", "steps"])
def test_a_sandbox_whose_deadline_passed_while_the_host_slept_is_ended_at_the_deadline(
    victim: tuple[subprocess.Popen[bytes], list[str]],
    monkeypatch: pytest.MonkeyPatch,
    timer: str,
) -> None:
    proc, targets = victim
    if timer == "steps":
        monkeypatch.setattr(watchdog_program, "DeadlineTimer", _NoTimer)
    _after_a_suspend(monkeypatch)
    read_fd, write_fd = os.pipe()
    serving = threading.Thread(target=watchdog_program.serve, args=(read_fd,), daemon=True)
    serving.start()
    try:
        key = _key()
        deadline = lease_clock() + 0.2
        lines = [f"deadline {key} {deadline:.6f}", *(f"watch {key} {t}" for t in targets)]
        os.write(write_fd, "".join(f"{line}\n" for line in lines).encode())
        # On the monotonic clock the deadline is still SLEPT_SECONDS away.
        proc.wait(timeout=30)
        assert proc.returncode == -signal.SIGKILL
        assert lease_clock() >= deadline
    finally:
        os.close(write_fd)  # the watchdog kills what it still watches and returns
        serving.join(timeout=30)
        os.close(read_fd)
    assert not serving.is_alive()


def test_floom_reads_an_attempt_s_deadline_on_the_boot_clock_too(
    fence: LeaseFence, monkeypatch: pytest.MonkeyPatch
) -> None:
    key = _key()
    assert fence.arm(key, lease_clock() + 0.2)
    _after_a_suspend(monkeypatch)
    # Lapsed here as in the watchdog: the attempt records nothing and stops at once.
    wait_until(lambda: fence.lapsed(key), timeout=10)
    fence.forget(key)


def _boot_clock_timers(pid: int) -> list[tuple[str, float]]:
    """Each CLOCK_BOOTTIME timerfd of process `pid`: its settime flags and the seconds left."""
    found = []
    for info in Path(f"/proc/{pid}/fdinfo").iterdir():
        try:
            fields = dict(
                line.split(":", 1) for line in info.read_text().splitlines() if ":" in line
            )
        except OSError:
            continue
        if fields.get("clockid", "").strip() != str(int(time.CLOCK_BOOTTIME)):
            continue
        seconds, nanoseconds = fields["it_value"].strip(" ()").split(",")
        found.append((fields["settime flags"].strip(), int(seconds) + int(nanoseconds) / 1e9))
    return found


def test_the_watchdog_waits_for_a_deadline_on_a_boot_clock_timer_set_to_it(
    fence: LeaseFence,
) -> None:
    """A select timeout is counted on CLOCK_MONOTONIC, so a suspend would also lengthen the
    wait: the watchdog sleeps on a CLOCK_BOOTTIME timer set to the deadline itself (absolute),
    which the kernel fires at the resume when the deadline passed while the host slept."""
    key = _key()
    deadline = lease_clock() + 300
    before = lease_clock()
    assert fence.arm(key, deadline)
    pid = fence.watchdog_pid
    assert pid is not None
    timers = wait_until(lambda: _boot_clock_timers(pid), timeout=10)
    after = lease_clock()
    assert len(timers) == 1
    flags, left = timers[0]
    assert flags == "01"  # TFD_TIMER_ABSTIME
    # Read between `before` and `after`: what is left lies between what was left then.
    assert deadline - after <= left <= deadline - before
    fence.forget(key)
