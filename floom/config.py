"""floom's settings, read from FLOOM_* environment variables."""

from __future__ import annotations

from functools import cached_property
from pathlib import Path

from pydantic import Field
from pydantic_settings import BaseSettings, SettingsConfigDict

DEFAULT_PORT = 8321


def _default_data_dir() -> Path:
    return Path.home() / ".floom"


class Settings(BaseSettings):
    """Every setting is an environment variable named FLOOM_<NAME>."""

    model_config = SettingsConfigDict(env_prefix="FLOOM_", extra="ignore")

    data_dir: Path = Field(default_factory=_default_data_dir)
    database_url: str = ""
    bootstrap_api_key: str = ""
    secret_key: str = ""
    host: str = "127.0.0.1"
    port: int = DEFAULT_PORT
    public_url: str = ""
    roles: str = "api,scheduler,executor"
    node_id: str = ""
    sandbox: str = "local"
    executor_slots: int = 4
    lease_seconds: float = 30.0
    heartbeat_seconds: float = 2.0
    reap_interval_seconds: float = 5.0
    # A claimed handoff job returns to `published` when its assignee is silent this long.
    handoff_lease_seconds: float = 600.0
    poll_interval_seconds: float = 0.5
    deploy_examples: bool = True
    examples_dir: Path | None = None
    max_bundle_bytes: int = 50 * 1024 * 1024
    max_artifact_bytes: int = 25 * 1024 * 1024
    max_log_lines_per_run: int = 100_000

    @cached_property
    def resolved_database_url(self) -> str:
        if self.database_url:
            return self.database_url
        return f"sqlite:///{self.data_dir / 'floom.db'}"

    @property
    def admin_key_file(self) -> Path:
        return self.data_dir / "admin.key"

    @property
    def secret_key_file(self) -> Path:
        return self.data_dir / "secret.key"

    @property
    def work_root(self) -> Path:
        return self.data_dir / "runs"

    @property
    def role_set(self) -> set[str]:
        return {r.strip() for r in self.roles.split(",") if r.strip()}

    def resolved_examples_dir(self) -> Path | None:
        if self.examples_dir is not None:
            return self.examples_dir if self.examples_dir.is_dir() else None
        shipped = Path(__file__).resolve().parent.parent / "workers"
        return shipped if shipped.is_dir() else None


def client_base_url() -> str:
    """The base URL the CLI and the stdio MCP server talk to."""
    import os

    url = os.environ.get("FLOOM_BASE_URL")
    if url:
        return url.rstrip("/")
    port = os.environ.get("FLOOM_PORT", str(DEFAULT_PORT))
    return f"http://127.0.0.1:{port}"


def mask_password(url: str) -> str:
    """The URL with any password replaced by ***, for printing."""
    import re

    return re.sub(r"(://[^:/@]*:)[^@/]*@", r"\1***@", url)
