"""`floom serve` with the in-memory fake sandbox (floom/sandbox/fake.py) as FLOOM_SANDBOX=fake:
the control plane alone (API, queue, leases, logs, store), for bench_control_plane.py. A run
of any script worker prints LINES lines and leaves result.json; no process is started.

Bench-only: the fake isolates nothing and is never a backend floom ships as a setting.
"""

from __future__ import annotations

import sys
from collections.abc import Callable
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from floom.cli import main
from floom.sandbox import BACKENDS
from floom.sandbox.base import LineSink, SandboxResult, SandboxSpec
from floom.sandbox.fake import FakeProcess, FakeSandbox

LINES = 20


def program(process: FakeProcess) -> int:
    for i in range(LINES):
        process.print(f"line {i}: the quick brown fox jumps over the lazy dog")
    process.write("result.json", '{"outputs": {}}')
    return 0


class _Unkept(FakeSandbox):
    """The fake, without its record of every spec (tests read it; a bench would only grow)."""

    def run(
        self, spec: SandboxSpec, *, on_line: LineSink, should_cancel: Callable[[], bool]
    ) -> SandboxResult:
        try:
            return super().run(spec, on_line=on_line, should_cancel=should_cancel)
        finally:
            self.specs.clear()
            self.sessions.clear()


BACKENDS["fake"] = lambda settings: _Unkept({"run.py": program})

if __name__ == "__main__":
    main()
