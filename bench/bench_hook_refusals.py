"""How long /hooks takes to refuse a request no webhook verifies: at a GitHub hook that is
there (wrong signature), at one whose secret is not set, and at no hook at all. The answers
are the same (test_hook_boundaries.py); this shows how near their times are.

Run from the repository root (through `/work/bin/slot --all` on a shared machine):

    .venv/bin/python bench/bench_hook_refusals.py [--requests 400] [--body-kib 64]

Prints, per hook, the median and p90 of the answer's time over interleaved rounds.
"""

from __future__ import annotations

import argparse
import hashlib
import hmac
import statistics
import sys
import tempfile
import time
from pathlib import Path

import httpx

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from tests.support.harness import deploy_folder, live_server, make_worker


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--requests", type=int, default=400)
    parser.add_argument("--body-kib", type=int, default=64)
    args = parser.parse_args()
    body = b'{"pad": "' + b"x" * (args.body_kib * 1024) + b'"}'
    mac = hmac.new(b"not-the-secret", body, hashlib.sha256).hexdigest()
    headers = {"X-Hub-Signature-256": f"sha256={mac}", "X-GitHub-Delivery": "guid"}
    with tempfile.TemporaryDirectory() as tmp:
        data = Path(tmp)
        with live_server(
            data / "data",
            f"sqlite:///{data}/floom.db",
            webhook_failures_per_minute=0,
            webhook_hook_failures_per_minute=0,
            anonymous_rate_limit_per_minute=0,
        ) as srv:
            api = srv.client()
            api.put("/api/v1/secrets/GH_SECRET", json={"value": "the-secret"})
            for name, secret in (("there", "GH_SECRET"), ("unready", "UNSET_SECRET")):
                manifest = (
                    f"name: {name}\ninputs: {{event: object}}\ntriggers:\n"
                    f"  - webhook: {{signature: github, secret: {secret}}}\n"
                )
                deploy_folder(api, make_worker(data / name, manifest, {"run.py": "print(1)\n"}))
            times: dict[str, list[float]] = {"there": [], "unready": [], "absent": []}
            with httpx.Client(base_url=srv.base_url, timeout=30) as client:
                for _ in range(20):  # warm up
                    client.post("/hooks/absent", content=body, headers=headers)
                for _ in range(args.requests):
                    for name, samples in times.items():
                        start = time.perf_counter()
                        answer = client.post(f"/hooks/{name}", content=body, headers=headers)
                        samples.append(time.perf_counter() - start)
                        assert answer.status_code == 401, answer.text
    print(f"{args.requests} refusals each, body {args.body_kib} KiB")
    for name, samples in times.items():
        ordered = sorted(samples)
        p90 = ordered[int(len(ordered) * 0.9)]
        print(
            f"  /hooks/{name:8} median {statistics.median(samples) * 1e3:.2f} ms, "
            f"p90 {p90 * 1e3:.2f} ms"
        )


if __name__ == "__main__":
    main()
