"""floom's settings, read from FLOOM_* environment variables."""

from __future__ import annotations

import ipaddress
import os
from functools import cached_property
from pathlib import Path
from typing import Final, Literal
from urllib.parse import urlsplit

from pydantic import Field, field_validator, model_validator
from pydantic_settings import BaseSettings, SettingsConfigDict

from floom.client_env import DEFAULT_PORT
from floom.net.egress import ALLOW_HINT, parse_allowed_networks

# What a node may do (FLOOM_ROLES): serve the API and UI, fire schedules, execute runs.
ROLES = ("api", "scheduler", "executor")
# floom's own keys are flm_ and 43 random characters; a bootstrap key shorter than this is
# one a person typed (a placeholder, a word).
MIN_BOOTSTRAP_KEY_CHARS = 32
# The most sandbox uids one run holds at once: its own, and its network helper's
# (slirp4netns) or its warm process's (floom/sandbox/local/uid_pool.py).
UIDS_PER_RUN = 2


def _default_data_dir() -> Path:
    return Path.home() / ".floom"


class Settings(BaseSettings):
    """Every setting is an environment variable named FLOOM_<NAME>."""

    # hide_input_in_errors: a refused value (a key, a database URL with its password) is
    # named in the error, never shown, wherever the error is printed or logged.
    model_config = SettingsConfigDict(
        env_prefix="FLOOM_", extra="ignore", hide_input_in_errors=True
    )

    data_dir: Path = Field(default_factory=_default_data_dir)
    database_url: str = ""
    bootstrap_api_key: str = ""
    secret_key: str = ""
    host: str = "127.0.0.1"
    port: int = DEFAULT_PORT
    public_url: str = ""
    roles: str = "api,scheduler,executor"
    node_id: str = Field("", max_length=80)
    sandbox: str = "local"
    # The E2B backend (floom/sandbox/e2b/backend.py): the key falls back to E2B_API_KEY; the
    # template a worker runs in unless its worker.yml names one. E2B_DOMAIN etc. are the SDK's own.
    e2b_api_key: str = ""
    e2b_template: str = "base"
    # E2B warm starts (floom/sandbox/e2b/warm.py; docs/how-to/warm-starts.md): this many
    # sandboxes created ahead of runs per template and network (0: off), each for one run
    # and killed after it; a pool unused for the idle time is emptied (and a ready sandbox
    # that old replaced); at most the budget of them ready on the node at once.
    e2b_warm: int = Field(0, ge=0, le=64)
    e2b_warm_idle_seconds: float = Field(300.0, ge=10, le=3540)
    e2b_warm_budget: int = Field(8, ge=1, le=1024)
    # When floom runs as root, each running local sandbox has a host uid (and gid) of its own
    # from [base, base + count), never root (floom/sandbox/local/uid_pool.py;
    # docs/reference/resource-limits.md).
    sandbox_uid_base: int = Field(0x70000000, ge=1, le=2**31 - 1)
    sandbox_uid_count: int = Field(1024, ge=1, le=1 << 20)
    # Warm starts (floom/sandbox/local/warm/; README: Warm starts): runs of workers with
    # `warm: true` fork from a pre-initialised interpreter kept per version. Off: all cold.
    warm_enabled: bool = True
    # Children kept ready per pool at most (demand decides how many up to it); unset: one
    # more than the executor's slots (at least 4), so each run at once finds one.
    warm_ready: int | None = Field(None, ge=1, le=64)
    warm_recycle_runs: int = Field(200, ge=1)
    warm_recycle_seconds: float = Field(600.0, gt=0)
    warm_idle_seconds: float = Field(300.0, gt=0)
    warm_memory_mb: int = Field(1024, ge=16)
    # Ceilings on what one run's worker.yml `limits` may ask for on this server (unset: only
    # worker.yml's own bounds); a worker over one is refused at deploy and by validate
    # (floom/services/workers/limit_ceilings.py; docs/reference/resource-limits.md).
    max_timeout_seconds: int | None = Field(None, ge=1)
    max_memory_mb: int | None = Field(None, ge=16)
    max_processes: int | None = Field(None, ge=8)
    max_cpu: float | None = Field(None, ge=0.05)
    max_disk_mb: int | None = Field(None, ge=1)
    max_tool_iterations: int | None = Field(None, ge=1)
    executor_slots: int = 4
    # A line per HTTP request on stdout (uvicorn's access log): about 0.3 ms of the server's
    # CPU each, and what matters of a run, webhook or decision is in the store already.
    access_log: bool = False
    lease_seconds: float = 30.0
    # The reaper takes an expired lease only this long after its expiry: the node that held
    # it had its watchdog end the sandbox before the expiry; this covers the kill and the
    # round trip of a node's reading of the database's clock, which leases are written and
    # judged on (docs/explanation/runs-survive-failures.md).
    lease_grace_seconds: float = Field(1.0, ge=0)
    heartbeat_seconds: float = 2.0
    reap_interval_seconds: float = 5.0
    # On SIGTERM or Ctrl-C a node stops claiming and gives running attempts this long to end
    # before it interrupts them (a second signal interrupts at once); see
    # docs/explanation/runs-survive-failures.md.
    drain_seconds: float = Field(30.0, ge=0)
    # How often a node kills sandboxes it left to runs it no longer runs (and at start).
    sandbox_reap_seconds: float = Field(60.0, gt=0)
    # A claimed handoff job returns to `published` when its assignee is silent this long.
    handoff_lease_seconds: float = 600.0
    poll_interval_seconds: float = 0.5
    # On PostgreSQL, hear other nodes' queued runs, cancels and key revocations at once over
    # LISTEN/NOTIFY (floom/store/signals.py). Off (e.g. behind a transaction-pooling proxy,
    # where LISTEN does not work): nodes poll, and no node caches API keys.
    signals: bool = True
    # On PostgreSQL, each of this node's connections (floom/store/statements/lock_waits.py;
    # docs/how-to/cluster.md "When a node freezes"): a lock another node holds longer than
    # this fails the wait (an API request answers 503 row_locked with Retry-After, a loop
    # tries again); a transaction left idle this long (its node frozen: SIGSTOP, a paused
    # VM) is ended by PostgreSQL, which lets its locks go. 0: the server's (or the role's)
    # own setting. SQLite: neither.
    lock_timeout_seconds: float = Field(10.0, ge=0, le=3600)
    idle_in_transaction_seconds: float = Field(60.0, ge=0, le=86400)
    deploy_examples: bool = True
    examples_dir: Path | None = None
    max_bundle_bytes: int = 50 * 1024 * 1024
    max_artifact_bytes: int = 25 * 1024 * 1024
    max_log_lines_per_run: int = 100_000
    # What the host reads of a run (floom/engine/collect.py, runlog.py): the largest
    # result.json, and the log bytes one attempt may store before further lines are dropped.
    max_result_bytes: int = Field(1024 * 1024, ge=1)
    max_log_bytes_per_run: int = Field(10 * 1024 * 1024, ge=1)
    # Each attempt's log rate (runlog.LogBudget): a token bucket of lines and bytes a second
    # that holds ten seconds of each; lines over it are dropped, and one line in the log
    # says how many, per five seconds of dropping. 0: no budget of that kind.
    log_lines_per_second: float = Field(1000, ge=0)
    log_bytes_per_second: float = Field(1024 * 1024, ge=0)
    # Runs one API key may wait for at once on a node (`?wait=`, MCP waits; 429 above).
    max_waits_per_key: int = Field(8, ge=1)
    # Streams one API key may hold open at once on a node (SSE log streams of the API and
    # the web UI, the MCP endpoint's event streams; 429 too_many_streams above).
    max_streams_per_key: int = Field(16, ge=1)
    # Quotas (floom/services/runs/lifecycle.py, floom/api/auth.py): the largest inputs of one run as
    # JSON, and each API key's request rate, a token bucket refilled at rate_limit_per_minute
    # that holds rate_limit_burst (0 a minute: no limit). The rate is counted per process.
    max_input_bytes: int = Field(1024 * 1024, ge=1)
    # The largest state (as JSON) a worker with `state:` may keep; worker.yml's
    # state.max_bytes may ask for less, never more (refused at deploy).
    max_state_bytes: int = Field(256 * 1024, ge=1)
    # State versions kept per worker (history, restores, replays' bases): writing a new one
    # deletes those older than the last state_history.
    state_history: int = Field(100, ge=1, le=1_000_000)
    rate_limit_per_minute: int = Field(1200, ge=0)
    rate_limit_burst: int = Field(600, ge=1)
    # What reaches floom without a valid key (webhooks, the sign-in page, /healthz, failed
    # keys), per client address (floom/api/address_limit.py); 0 a minute: no limit.
    anonymous_rate_limit_per_minute: int = Field(600, ge=0)
    anonymous_rate_limit_burst: int = Field(300, ge=1)
    # The proxies whose Forwarded / X-Forwarded-* headers floom believes (floom/api/
    # forwarded.py): addresses or networks, comma-separated; "*" any peer, "" none.
    forwarded_allow_ips: str = "127.0.0.1,::1"
    # Every request body but deploys, /mcp and /hooks (floom/api/edge/bodies.py); read no
    # further than this before a route sees it.
    max_request_bytes: int = Field(4 * 1024 * 1024, ge=1024)
    # The time any such body (a deploy's too) may take to arrive, read before a key is
    # checked: a caller that dribbles one (a slow-loris) is answered 408, not held for good.
    request_body_seconds: float = Field(120.0, gt=0, le=3600)
    # HTTP connections (floom/api/edge/connections.py): the time a request's line and headers
    # may take to arrive, counted from when its connection waits for it (opened, or its last
    # answer sent); their size; and the connections a node holds at once (no more than half
    # its open-file limit), one more closing the longest idle.
    request_header_seconds: float = Field(15.0, gt=0, le=3600)
    max_header_bytes: int = Field(64 * 1024, ge=1024, le=16 * 1024 * 1024)
    max_connections: int = Field(1000, ge=1)
    # The time an answer's bytes may wait on a client that takes none of them (a stalled
    # reader of a log stream, or a client gone without a word): then its connection is
    # closed, and a stream's place given back.
    response_send_seconds: float = Field(60.0, gt=0, le=3600)
    # Triggers (floom/services/triggers/webhooks.py): the largest webhook body accepted, and the
    # Standard Webhooks secret of Composio's deliveries to /hooks/composio.
    webhook_max_bytes: int = 1024 * 1024
    # The time a webhook's whole body may take to arrive: a sender that dribbles it (a
    # slow-loris) is answered 408 and its connection closed, not held for good.
    webhook_body_seconds: float = Field(30.0, gt=0, le=3600)
    # Deliveries to /hooks that no secret verifies, per client address and per hook, a
    # minute (and at once); past either, that address (or hook) is answered 429 before its
    # body is read or any signature computed (floom/api/address_limit.py). 0: no limit.
    webhook_failures_per_minute: int = Field(30, ge=0)
    webhook_hook_failures_per_minute: int = Field(120, ge=0)
    composio_webhook_secret: str = ""
    # Retention (floom/services/ops/retention.py): finished runs' logs and artifacts are deleted
    # this many days after the run ended (0: kept forever; a worker's `retention_days` wins),
    # by nodes with the scheduler role every retention_interval_seconds.
    retention_days: int = Field(0, ge=0, le=36500)
    retention_interval_seconds: float = Field(3600.0, ge=1.0)
    # The same passes delete alert events, closed incidents and sent (or given-up) deliveries
    # this many days old (0: kept forever); open incidents, events about runs not yet ended
    # and pending deliveries stay.
    alert_retention_days: int = Field(90, ge=0, le=36500)
    # Alerts and run callbacks (floom/services/alerts/): the watch looks every
    # alert_poll_seconds; a delivery is tried up to alert_max_attempts times, waiting
    # alert_retry_seconds, then twice that, and so on (at most an hour); each channel sends
    # at most alert_throttle_count alerts per alert_throttle_seconds (the rest are kept,
    # marked throttled, and can be re-sent). A run waiting for approval longer than
    # alert_approval_wait_seconds alerts; a schedule's tick with no run after
    # alert_schedule_grace_seconds is missed (late: its run had not started), and its run
    # still going after alert_schedule_stuck_seconds is stuck.
    alert_poll_seconds: float = Field(5.0, gt=0)
    alert_max_attempts: int = Field(8, ge=1, le=50)
    alert_retry_seconds: float = Field(10.0, ge=0)
    alert_timeout_seconds: float = Field(10.0, gt=0)
    alert_throttle_count: int = Field(20, ge=1)
    alert_throttle_seconds: float = Field(3600.0, gt=0)
    alert_approval_wait_seconds: float = Field(3600.0, gt=0)
    alert_schedule_grace_seconds: float = Field(300.0, gt=0)
    alert_schedule_stuck_seconds: float = Field(3600.0, gt=0)
    # Blob storage (floom/store/blobs/; README: Object storage): where new version archives,
    # artifacts, agent workspaces and ended runs' logs go: "database" (rows of the blobs
    # table) or "s3" (an S3-compatible bucket). The S3 settings are also needed to read what
    # an earlier "s3" left there. Credentials: FLOOM_S3_ACCESS_KEY_ID and
    # FLOOM_S3_SECRET_ACCESS_KEY, else the shared-credentials file FLOOM_S3_CREDENTIALS_FILE
    # (its [default] section), else the S3 client's own chain (AWS_* variables, instance roles).
    blob_store: Literal["database", "s3"] = "database"
    s3_endpoint: str = ""
    s3_bucket: str = ""
    s3_prefix: str = "floom/"
    s3_region: str = "us-east-1"
    s3_access_key_id: str = ""
    s3_secret_access_key: str = ""
    s3_credentials_file: Path | None = None
    # A run's end waits this long at most for its artifacts' upload (the client retries
    # within it); past it they are kept in the database and uploaded later.
    s3_timeout_seconds: float = Field(10.0, gt=0)
    # How often a node with the executor role looks for uploads left pending and ended runs'
    # logs still in the database, besides at each run end it records.
    blob_sweep_seconds: float = Field(30.0, gt=0)
    # Agent workers (floom/agent/). The provider key falls back to ANTHROPIC_API_KEY.
    model: str = "claude-sonnet-4-5"
    anthropic_api_key: str = ""
    anthropic_base_url: str = ""
    agent_max_iterations: int = 50
    agent_max_depth: int = 3
    agent_max_output_tokens: int = 4096
    composio_api_key: str = ""
    composio_base_url: str = "https://backend.composio.dev"
    # Non-public networks ("10.1.2.0/24,...") that connections floom makes on a worker's
    # behalf (http_request, MCP tool sources, Composio; floom/net/egress.py) may reach. Loopback
    # and the host's own addresses stay closed whatever is listed.
    egress_allow: str = ""
    # UNSAFE, for tests only: let those connections reach private, loopback and the host's
    # own addresses, and resolve names from "host=address,..." instead of DNS (curl --resolve).
    agent_http_allow_private: bool = False
    agent_http_resolve: str = ""

    @field_validator("roles")
    @classmethod
    def _known_roles(cls, value: str) -> str:
        """A typo in FLOOM_ROLES would leave a node silently doing nothing: refuse it."""
        given = [r.strip() for r in value.split(",") if r.strip()]
        unknown = [r for r in given if r not in ROLES]
        if unknown:
            raise ValueError(
                f"unknown role {', '.join(repr(r) for r in unknown)}; "
                f"roles are {', '.join(ROLES)} (comma-separated)"
            )
        if not given:
            raise ValueError(f"no role given; roles are {', '.join(ROLES)} (comma-separated)")
        return ",".join(r for r in ROLES if r in given)

    @field_validator("bootstrap_api_key")
    @classmethod
    def _bootstrap_key(cls, value: str) -> str:
        """The first admin key is guessed at by anyone who reaches the port (the anonymous
        rate lets an address try hundreds a minute): a short or placeholder one is refused
        at start, without echoing it."""
        if value and len(value) < MIN_BOOTSTRAP_KEY_CHARS:
            raise ValueError(
                f"the key has fewer than {MIN_BOOTSTRAP_KEY_CHARS} characters, so whoever "
                "reaches the server could guess it; make one with flm_$(openssl rand -hex 24). "
                "If a floom already started with the short one, it is still the first key, "
                "with every scope: start without it, make a new one with it (floom keys "
                "create) and revoke it (floom keys revoke)"
            )
        return value

    @property
    def warm_ready_children(self) -> int:
        """FLOOM_WARM_READY, or when unset one more than the executor's slots (at least 4,
        at most 64): a pool's target is one more than its runs at once, up to this."""
        if self.warm_ready is not None:
            return self.warm_ready
        return min(64, max(4, self.executor_slots + 1))

    @model_validator(mode="after")
    def _enough_sandbox_uids(self) -> Settings:
        """An executor whose uid range cannot give each of its slots' runs the uids it takes
        would refuse runs (or a warm process) whenever its slots are busy: refused at start."""
        needed = self.executor_slots * UIDS_PER_RUN
        if "executor" in self.role_set and self.sandbox_uid_count < needed:
            raise ValueError(
                f"FLOOM_SANDBOX_UID_COUNT is too small for FLOOM_EXECUTOR_SLOTS: each run at "
                f"once may hold {UIDS_PER_RUN} sandbox uids (its own, and its network "
                f"helper's or its warm process's), so this node needs at least {needed}; "
                f"raise FLOOM_SANDBOX_UID_COUNT to {needed} or more (a free block of uids, "
                "docs/reference/resource-limits.md, Sandbox uids) or lower "
                "FLOOM_EXECUTOR_SLOTS"
            )
        return self

    @field_validator("s3_prefix")
    @classmethod
    def _object_prefix(cls, value: str) -> str:
        """Keys are <prefix>blobs/<digest>: a prefix is a folder of the bucket, or nothing."""
        value = value.strip().lstrip("/")
        return value if not value or value.endswith("/") else value + "/"

    @field_validator("s3_endpoint")
    @classmethod
    def _endpoint(cls, value: str) -> str:
        """An S3 endpoint is shown (floom doctor, errors, logs): a URL with credentials in it
        would show them, and one that is not http(s)://host would fail at the first upload."""
        value = value.strip()
        if not value:
            return value
        parsed = urlsplit(value)
        if parsed.scheme not in ("http", "https") or not parsed.hostname:
            raise ValueError(
                "give the endpoint as http(s)://HOST[:PORT], e.g. http://127.0.0.1:8333"
            )
        if parsed.username is not None or parsed.password is not None:
            raise ValueError(
                "the endpoint holds credentials; give the URL without them, and the keys in "
                "FLOOM_S3_ACCESS_KEY_ID and FLOOM_S3_SECRET_ACCESS_KEY "
                "(or FLOOM_S3_CREDENTIALS_FILE)"
            )
        if parsed.query or parsed.fragment:
            raise ValueError("the endpoint holds a query or fragment; give http(s)://HOST[:PORT]")
        return value

    @field_validator("forwarded_allow_ips")
    @classmethod
    def _networks(cls, value: str) -> str:
        """A typo would silently trust no proxy (or the wrong one): refuse it at start."""
        trusted_networks(value)
        return value

    @field_validator("egress_allow")
    @classmethod
    def _allowable_networks(cls, value: str) -> str:
        """A bad entry would leave a network closed (or wider open) unnoticed: refuse it."""
        try:
            parse_allowed_networks(value)
        except ValueError as exc:
            raise ValueError(f"{exc}; {ALLOW_HINT}") from exc
        return value

    @property
    def model_key(self) -> str:
        """The model provider key agent runs use: FLOOM_ANTHROPIC_API_KEY, else
        ANTHROPIC_API_KEY; "" when neither is set."""
        return self.anthropic_api_key or os.environ.get("ANTHROPIC_API_KEY", "")

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

    def limit_ceilings(self) -> dict[str, float]:
        """The ceilings set on this server, by the worker.yml limit each caps."""
        found = {key: getattr(self, setting) for key, setting in LIMIT_CEILINGS.items()}
        return {key: value for key, value in found.items() if value is not None}

    @property
    def role_set(self) -> set[str]:
        return {r.strip() for r in self.roles.split(",") if r.strip()}

    def resolved_examples_dir(self) -> Path | None:
        if self.examples_dir is not None:
            return self.examples_dir if self.examples_dir.is_dir() else None
        shipped = Path(__file__).resolve().parent.parent / "workers"
        return shipped if shipped.is_dir() else None


LIMIT_CEILINGS: Final = {
    "timeout_seconds": "max_timeout_seconds",
    "memory_mb": "max_memory_mb",
    "processes": "max_processes",
    "cpu": "max_cpu",
    "disk_mb": "max_disk_mb",
    "max_tool_iterations": "max_tool_iterations",
}
"""worker.yml's `limits.<key>`: the setting of its ceiling
(floom/services/workers/limit_ceilings.py)."""


def mask_password(url: str) -> str:
    """The URL with any password replaced by ***, for printing."""
    import re

    return re.sub(r"(://[^:/@]*:)[^@/]*@", r"\1***@", url)


def trusted_networks(
    value: str,
) -> list[ipaddress.IPv4Network | ipaddress.IPv6Network] | None:
    """FLOOM_FORWARDED_ALLOW_IPS as networks: addresses or CIDR ranges, comma-separated;
    None for "*" (trust every peer); an empty list for "" (trust none). Raises ValueError
    naming an entry that is neither."""
    entries = [e.strip() for e in value.split(",") if e.strip()]
    if "*" in entries:
        return None
    networks = []
    for entry in entries:
        try:
            networks.append(ipaddress.ip_network(entry, strict=False))
        except ValueError:
            raise ValueError(
                f"'{entry}' is not an address or a network (such as 10.0.0.0/8), nor '*'"
            ) from None
    return networks
