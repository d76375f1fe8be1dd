"""A small client of floom's REST API, shared by the CLI and the stdio MCP server.

It prints nothing: every failure is a FloomError carrying floom's error code, message and hint
(the server's own subclass, rebuilt from the code).
"""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any
from urllib.parse import quote

import httpx

from floom.client.wire import (
    CONNECT_SECONDS,
    USER_AGENT,
    WAIT_CALL_SECONDS,
    WAIT_READ_MARGIN_SECONDS,
    StartRequest,
    answer_error,
    bad_url,
    missing_key,
    sse_events,
    text_lines,
    timed_out,
    transport_failed,
    unreachable,
)
from floom.client.wire import configured_api_key as configured_api_key
from floom.client.wire import url_path as url_path
from floom.client_env import admin_key_file, client_base_url
from floom.errors import ClientError, FloomError, TooManyWaits
from floom.hints import act, told
from floom.services.runs.statuses import FINISHED as TERMINAL_STATUSES
from floom.services.runs.statuses import WAITING as WAITING_STATUSES

if TYPE_CHECKING:
    from floom.client import models as models  # floom.client.handoffs takes it from here
else:

    class _Models:
        """floom.client.models. Imported on first use of one of its models: pydantic and
        floom/schemas are most of the client's import (0.18 s -> 0.08 s without them), which
        a command that never reads an answer need not pay. mypy reads the module itself."""

        def __getattr__(self, name: str) -> Any:
            from floom.client import models as loaded

            return getattr(loaded, name)

    models = _Models()


POLL_SECONDS = 0.3
MIN_WAIT_CALL_SPACING_SECONDS = 1.0
RECONNECT_SECONDS = 0.5
# Streams that break this many times in a row give way to polling /logs, which always works.
MAX_STREAM_FAILURES = 3


ApiError = FloomError
"""What every client failure is: the server's own FloomError subclass rebuilt from its code
(`NotFound`, `Forbidden`, ...), or a ClientError (status 0) when no answer came."""


@dataclass(frozen=True)
class FollowEvent:
    """One item of a followed run: a log line ("log", the event) or the end ("end", the run)."""

    kind: str
    data: dict[str, Any]


def admin_key_path() -> Path | None:
    """Where a local server keeps its admin key (FLOOM_DATA_DIR/admin.key)."""
    return admin_key_file()


def _error_from(response: httpx.Response) -> FloomError:
    return answer_error(response.status_code, response.content, response.text)


class FloomClient:
    """One method per REST route; results are the public models of floom/schemas, validated
    from the JSON bodies."""

    def __init__(
        self,
        base_url: str | None = None,
        api_key: str | None = None,
        *,
        timeout: float = 30.0,
        transport: httpx.BaseTransport | None = None,
        surface: str | None = None,
    ) -> None:
        self.base_url = (base_url or client_base_url()).rstrip("/")
        self.api_key = api_key
        headers = {"User-Agent": USER_AGENT}
        if api_key:
            headers["Authorization"] = f"Bearer {api_key}"
        if surface:
            # The server records runs started from the CLI as "manual", from MCP as "mcp".
            headers["X-Floom-Client"] = surface
        # A plain-HTTP server involves no TLS (and redirects are not followed), so there is
        # no certificate to verify: skipping the TLS context saves ~0.4 s of every CLI call.
        plain = self.base_url.startswith("http://")
        self._http = httpx.Client(
            base_url=self.base_url,
            headers=headers,
            timeout=timeout,
            transport=transport,
            verify=not plain,
        )

    @classmethod
    def from_env(cls, *, surface: str | None = None) -> FloomClient:
        """FLOOM_BASE_URL (or the local default) and the configured API key."""
        return cls(client_base_url(), configured_api_key(), surface=surface)

    def close(self) -> None:
        self._http.close()

    def __enter__(self) -> FloomClient:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # -- plumbing ------------------------------------------------------------------------------

    def _check_key(self) -> None:
        if self.api_key:
            return
        raise missing_key(admin_key_path())

    def _transport_error(self, exc: httpx.HTTPError) -> ClientError:
        if isinstance(exc, httpx.ConnectError):
            return unreachable(self.base_url)
        if isinstance(exc, httpx.TimeoutException):
            return timed_out(self.base_url)
        if isinstance(exc, httpx.UnsupportedProtocol | httpx.InvalidURL):
            return bad_url(self.base_url)
        return transport_failed(self.base_url, exc)

    def _send(self, method: str, path: str, *, auth: bool = True, **kwargs: Any) -> httpx.Response:
        if auth:
            self._check_key()
        try:
            response = self._http.request(method, path, **kwargs)
        except httpx.HTTPError as exc:
            raise self._transport_error(exc) from exc
        if response.is_error:
            raise _error_from(response)
        return response

    def request_json(self, method: str, path: str, **kwargs: Any) -> Any:
        """One call of the REST API and its JSON answer; a refusal raises the FloomError
        subclass of its code, a transport failure a transport error."""
        return self._send(method, path, **kwargs).json()

    @staticmethod
    def _params(**values: Any) -> dict[str, Any]:
        return {k: v for k, v in values.items() if v is not None}

    # -- health, workers, versions -------------------------------------------------------------

    def health(self) -> models.Health:
        result = self.request_json("GET", "/healthz", auth=False)
        return models.Health.model_validate(result)

    def deploy(self, archive: bytes, *, skip_eval_gate: bool = False) -> models.DeployResult:
        """Deploy a worker folder packed with floom.bundle (tar.gz); `skip_eval_gate`
        activates the version even though the worker's eval gate fails."""
        headers = {"Content-Type": "application/gzip"}
        params = {"skip_eval_gate": "true"} if skip_eval_gate else None
        # A worker with an eval gate answers once its eval ends (10 minutes at most).
        timeout = httpx.Timeout(30.0, read=660.0)
        result = self.request_json(
            "POST",
            "/api/v1/workers",
            content=archive,
            headers=headers,
            params=params,
            timeout=timeout,
        )
        return models.DeployResult.model_validate(result)

    def validate(self, archive: bytes) -> models.ValidationResult:
        headers = {"Content-Type": "application/gzip"}
        result = self.request_json(
            "POST", "/api/v1/workers/validate", content=archive, headers=headers
        )
        return models.ValidationResult.model_validate(result)

    def list_workers(
        self, *, cursor: str | None = None, limit: int | None = None
    ) -> models.Page[models.WorkerPublic]:
        params = self._params(cursor=cursor, limit=limit)
        result = self.request_json("GET", "/api/v1/workers", params=params)
        return models.Page[models.WorkerPublic].model_validate(result)

    def get_worker(self, name: str) -> models.WorkerDetail:
        result = self.request_json("GET", f"/api/v1/workers/{url_path(name)}")
        return models.WorkerDetail.model_validate(result)

    def list_versions(self, name: str) -> models.Page[models.VersionPublic]:
        result = self.request_json("GET", f"/api/v1/workers/{url_path(name)}/versions")
        return models.Page[models.VersionPublic].model_validate(result)

    def get_version(self, name: str, version_id: str) -> models.VersionDetail:
        """One version: its manifest (also as worker.yml text) and its file list."""
        path = f"/api/v1/workers/{url_path(name)}/versions/{url_path(version_id)}"
        result = self.request_json("GET", path)
        return models.VersionDetail.model_validate(result)

    def api_paths(self) -> set[str]:
        """The route templates this server offers (from its OpenAPI document), so a client
        can tell a feature the server lacks from a thing that does not exist."""
        doc = self.request_json("GET", "/openapi.json", auth=False)
        return set(doc.get("paths") or {})

    def rollback(
        self,
        name: str,
        *,
        version_id: str | None = None,
        run_id: str | None = None,
        state_version: int | None = None,
    ) -> models.RollbackResult:
        """Make a version active again: by its id, or the version a run used; with
        `state_version`, also set that kept state version again."""
        body = self._params(version_id=version_id, run_id=run_id, state_version=state_version)
        result = self.request_json("POST", f"/api/v1/workers/{url_path(name)}/rollback", json=body)
        return models.RollbackResult.model_validate(result)

    def get_state(self, name: str, *, version: int | None = None) -> models.WorkerStatePublic:
        """The worker's state: the current version's value and who wrote it, or a kept
        `version`'s."""
        result = self.request_json(
            "GET",
            f"/api/v1/workers/{url_path(name)}/state",
            params=self._params(version=version),
        )
        return models.WorkerStatePublic.model_validate(result)

    def set_state(
        self,
        name: str,
        *,
        state: Any = None,
        from_version: int | None = None,
        if_version: int | None = None,
    ) -> models.WorkerStatePublic:
        """Write a new state version: `state`, or a kept version's value again
        (`from_version`); with `if_version`, only while that is the current version."""
        body: dict[str, Any] = self._params(from_version=from_version, if_version=if_version)
        if from_version is None:
            body["state"] = state
        result = self.request_json("PUT", f"/api/v1/workers/{url_path(name)}/state", json=body)
        return models.WorkerStatePublic.model_validate(result)

    def state_versions(
        self, name: str, *, cursor: str | None = None, limit: int | None = None
    ) -> models.Page[models.StateVersionPublic]:
        """The worker's kept state versions, newest first."""
        result = self.request_json(
            "GET",
            f"/api/v1/workers/{url_path(name)}/state/versions",
            params=self._params(cursor=cursor, limit=limit),
        )
        return models.Page[models.StateVersionPublic].model_validate(result)

    def delete_worker(self, name: str, *, purge_runs: bool = False) -> models.WorkerDeleted:
        """Delete a worker (its triggers stop at once); its runs are kept unless purged.
        Answers what was deleted, as counts."""
        params = {"purge_runs": "true" if purge_runs else "false"}
        # A purge first waits (20 s at most) for the worker's running runs to stop.
        timeout = httpx.Timeout(10.0, read=60.0)
        result = self.request_json(
            "DELETE", f"/api/v1/workers/{url_path(name)}", params=params, timeout=timeout
        )
        return models.WorkerDeleted.model_validate(result)

    def list_triggers(self, name: str) -> models.TriggerListing:
        """The worker's triggers with their next fire times (and whether it is paused)."""
        result = self.request_json("GET", f"/api/v1/workers/{url_path(name)}/triggers")
        return models.TriggerListing.model_validate(result)

    def set_paused(
        self, name: str, *, paused: bool, trigger_id: str | None = None
    ) -> models.TriggerListing:
        """Pause or resume a worker, or one of its triggers; returns the trigger listing."""
        action = "pause" if paused else "resume"
        result = self.request_json(
            "POST",
            f"/api/v1/workers/{url_path(name)}/{action}",
            json=self._params(trigger_id=trigger_id),
        )
        return models.TriggerListing.model_validate(result)

    # -- runs ----------------------------------------------------------------------------------

    def start_run(
        self, worker: str, run: models.RunRequest, *, wait: float = 0, until: str = "ended"
    ) -> models.RunPublic:
        """Queue a run; with coerce_strings the input values are text parsed by declared type.
        `force` runs a paused worker. With `wait` (at most 60), the same request waits for the
        run to end (or settle) and answers with the whole run record; check its status, as
        the answer comes after `wait` seconds (or at once, over the key's cap of waits)
        either way (a RunDetail then, when the run settled). `callback_url` gets the run's
        record, signed, when it ends."""
        body = run.model_dump(exclude_none=True)
        request = StartRequest(worker, body, wait=wait, until=until)
        if request.read_seconds is None:
            return models.RunPublic.model_validate(
                self.request_json("POST", request.path, json=request.body)
            )
        timeout = httpx.Timeout(CONNECT_SECONDS, read=request.read_seconds)
        result = self.request_json(
            "POST", request.path, json=request.body, params=request.params, timeout=timeout
        )
        # 200 with the whole record when the run settled in time, 202 with the run otherwise.
        return (models.RunDetail if "tool_calls" in result else models.RunPublic).model_validate(
            result
        )

    def list_runs(self, query: models.RunQuery) -> models.Page[models.RunPublic]:
        result = self.request_json("GET", "/api/v1/runs", params=query.params())
        return models.Page[models.RunPublic].model_validate(result)

    def get_run(self, run_id: str, *, wait: float = 0, until: str = "ended") -> models.RunDetail:
        """The run; with `wait` (at most 60), the server answers as soon as it has ended (with
        until="settled", also when it waits for a person) or after `wait` seconds."""
        path = f"/api/v1/runs/{url_path(run_id)}"
        if wait <= 0:
            result = self.request_json("GET", path)
            return models.RunDetail.model_validate(result)
        params = {"wait": f"{wait:g}", "until": until}
        timeout = httpx.Timeout(CONNECT_SECONDS, read=wait + WAIT_READ_MARGIN_SECONDS)
        result = self.request_json("GET", path, params=params, timeout=timeout)
        return models.RunDetail.model_validate(result)

    def wait_for_run(
        self, run_id: str, *, seconds: float | None, until: str = "ended"
    ) -> models.RunDetail:
        """The run once it has ended (or settled), or as it is after `seconds` (None: no
        limit), waiting through the server's `?wait=`, one long request at a time."""
        stop = TERMINAL_STATUSES if until == "ended" else TERMINAL_STATUSES | WAITING_STATUSES
        deadline = None if seconds is None else time.monotonic() + seconds
        while True:
            asked = time.monotonic()
            left = WAIT_CALL_SECONDS if deadline is None else deadline - asked
            try:
                run = self.get_run(run_id, wait=min(WAIT_CALL_SECONDS, left), until=until)
            except TooManyWaits:
                # This key's other waits fill its cap: read now and ask again shortly.
                run = self.get_run(run_id)
            if run.status in stop or (deadline is not None and time.monotonic() >= deadline):
                return run
            # Not again at once when the server answered early without an end (one that
            # ignores ?wait=, or a full cap): that would be a busy loop.
            time.sleep(max(0.0, MIN_WAIT_CALL_SPACING_SECONDS - (time.monotonic() - asked)))

    def get_logs(
        self,
        run_id: str,
        *,
        after: int | None = None,
        tail: int | None = None,
        limit: int | None = None,
    ) -> models.LogPage:
        params = self._params(after=after, tail=tail, limit=limit)
        result = self.request_json("GET", f"/api/v1/runs/{url_path(run_id)}/logs", params=params)
        return models.LogPage.model_validate(result)

    def all_logs(self, run_id: str, *, after: int = 0) -> list[models.RunEventPublic]:
        """Every stored log event above `after`, reading page by page."""
        events: list[models.RunEventPublic] = []
        while True:
            page = self.get_logs(run_id, after=after)
            events.extend(page.items)
            if not page.items or page.complete:
                return events
            after = page.last_seq

    def list_artifacts(self, run_id: str) -> models.Page[models.ArtifactPublic]:
        result = self.request_json("GET", f"/api/v1/runs/{url_path(run_id)}/artifacts")
        return models.Page[models.ArtifactPublic].model_validate(result)

    def download_artifact(self, run_id: str, name: str) -> bytes:
        path = f"/api/v1/runs/{url_path(run_id)}/artifacts/{quote(name, safe='/')}"
        return self._send("GET", path).content

    def cancel_run(self, run_id: str) -> models.RunDetail:
        result = self.request_json("POST", f"/api/v1/runs/{url_path(run_id)}/cancel")
        return models.RunDetail.model_validate(result)

    def replay_run(
        self, run_id: str, *, latest: bool = False, force: bool = False
    ) -> models.RunPublic:
        """Run the same inputs again: on the same version, or the worker's active one."""
        body: dict[str, Any] = {"latest": latest}
        if force:
            body["force"] = True
        result = self.request_json("POST", f"/api/v1/runs/{url_path(run_id)}/replay", json=body)
        return models.RunPublic.model_validate(result)

    # -- replays from recordings and evals -----------------------------------------------------

    def start_replay(
        self,
        run_id: str,
        *,
        mode: str,
        version_id: str | None = None,
        model: str | None = None,
    ) -> models.RunPublic:
        """Replay an agent run from its recording (exact or what_if); the new run."""
        body = self._params(mode=mode, version_id=version_id, model=model)
        result = self.request_json("POST", f"/api/v1/runs/{url_path(run_id)}/replays", json=body)
        return models.RunPublic.model_validate(result)

    def get_replay(self, run_id: str) -> models.ReplayReport:
        """A replay's report: status, and once finished its diff against the original."""
        result = self.request_json("GET", f"/api/v1/replays/{url_path(run_id)}")
        return models.ReplayReport.model_validate(result)

    def start_eval(self, worker: str, start: models.EvalStart) -> models.EvalReport:
        body = start.model_dump(exclude_none=True)
        result = self.request_json("POST", f"/api/v1/workers/{url_path(worker)}/evals", json=body)
        return models.EvalReport.model_validate(result)

    def get_eval(self, eval_id: str) -> models.EvalReport:
        result = self.request_json("GET", f"/api/v1/evals/{url_path(eval_id)}")
        return models.EvalReport.model_validate(result)

    # -- webhook deliveries --------------------------------------------------------------------

    def list_deliveries(
        self, name: str, *, cursor: str | None = None, limit: int | None = None
    ) -> models.Page[models.DeliveryPublic]:
        """A worker's stored webhook and Composio deliveries, newest first."""
        result = self.request_json(
            "GET",
            f"/api/v1/workers/{url_path(name)}/deliveries",
            params=self._params(cursor=cursor, limit=limit),
        )
        return models.Page[models.DeliveryPublic].model_validate(result)

    def get_delivery(self, delivery_id: str) -> models.DeliveryDetail:
        result = self.request_json("GET", f"/api/v1/deliveries/{url_path(delivery_id)}")
        return models.DeliveryDetail.model_validate(result)

    def replay_delivery(self, delivery_id: str, *, force: bool = False) -> models.RunPublic:
        """Run a stored delivery again; returns the new run."""
        result = self.request_json(
            "POST", f"/api/v1/deliveries/{url_path(delivery_id)}/replay", json={"force": force}
        )
        return models.RunPublic.model_validate(result)

    # -- following a run -----------------------------------------------------------------------

    def follow(
        self, run_id: str, *, after: int = 0, deadline: float | None = None
    ) -> Iterator[FollowEvent]:
        """Yield a run's log events above `after` as they happen, then one "end" event with
        the run record. Uses the SSE stream, resuming from the last seq when it breaks, and
        polls /logs when streaming is unavailable. Raises ClientError(code="timeout") when the
        monotonic `deadline` passes first."""
        failures = 0
        while failures < MAX_STREAM_FAILURES:
            try:
                for event in self._stream(run_id, after=after, deadline=deadline):
                    failures = 0
                    if event.kind == "log":
                        after = max(after, int(event.data.get("seq", after)))
                    yield event
                    if event.kind == "end":
                        return
                failures += 1  # closed without an end: reconnect from the last seq
            except _StreamUnavailable:
                break
            except httpx.TimeoutException:
                pass  # a quiet stream; the deadline check below decides whether to go on
            except httpx.TransportError:
                failures += 1  # a broken connection or a restarting server
            if failures:
                time.sleep(RECONNECT_SECONDS * failures)
            self._check_deadline(run_id, deadline)
        yield from self._poll(run_id, after=after, deadline=deadline)

    def wait(self, run_id: str, *, deadline: float | None = None) -> models.RunDetail:
        """Block until the run ends; returns the full run record (with artifacts). Raises
        ClientError(code="timeout") when the monotonic `deadline` passes first."""
        seconds = None if deadline is None else max(0.0, deadline - time.monotonic())
        run = self.wait_for_run(run_id, seconds=seconds)
        if run.status not in TERMINAL_STATUSES:
            raise self._still_going(run)
        return run

    def _check_deadline(self, run_id: str, deadline: float | None) -> None:
        if deadline is not None and time.monotonic() >= deadline:
            run = self.get_run(run_id)
            if run.status in TERMINAL_STATUSES:
                return
            raise self._still_going(run)

    @staticmethod
    def _still_going(run: models.RunPublic) -> ClientError:
        return ClientError(
            f"run {run.id} is still {run.status} at the deadline",
            status=0,
            code="timeout",
            hint=told("it keeps going; follow it with ", act("logs", follow=True, run_id=run.id)),
        )

    def _stream(self, run_id: str, *, after: int, deadline: float | None) -> Iterator[FollowEvent]:
        self._check_key()
        read = 30.0
        if deadline is not None:
            read = max(0.5, min(read, deadline - time.monotonic()))
        timeout = httpx.Timeout(10.0, read=read)
        path = f"/api/v1/runs/{url_path(run_id)}/logs/stream"
        headers = {"Accept": "text/event-stream"}
        with self._http.stream(
            "GET", path, params={"after": after}, headers=headers, timeout=timeout
        ) as response:
            content_type = response.headers.get("content-type", "")
            # 429: this key holds as many streams as the server allows (too_many_streams);
            # reading the log page by page still works.
            if response.status_code in (404, 405, 429, 501) or (
                not response.is_error and not content_type.startswith("text/event-stream")
            ):
                raise _StreamUnavailable
            if response.is_error:
                response.read()
                raise _error_from(response)
            for kind, data in sse_events(text_lines(response.iter_bytes())):
                if kind in ("log", "end"):
                    yield FollowEvent(kind, json.loads(data))
                if deadline is not None and time.monotonic() >= deadline:
                    self._check_deadline(run_id, deadline)

    def _poll(self, run_id: str, *, after: int, deadline: float | None) -> Iterator[FollowEvent]:
        while True:
            page = self.get_logs(run_id, after=after)
            for item in page.items:
                yield FollowEvent("log", item.to_json())
            after = page.last_seq
            if page.complete:
                yield FollowEvent("end", self.get_run(run_id).to_json())
                return
            if not page.items:
                self._check_deadline(run_id, deadline)
                time.sleep(POLL_SECONDS)

    # -- nodes ---------------------------------------------------------------------------------

    def list_nodes(self) -> models.NodeList:
        result = self.request_json("GET", "/api/v1/nodes")
        return models.NodeList.model_validate(result)

    # -- alerts --------------------------------------------------------------------------------

    def alert_request(self, method: str, path: str, **kwargs: Any) -> Any:
        """A call of the alerts API (/api/v1/alerts/...): channels, rules, deliveries."""
        return self.request_json(method, f"/api/v1/alerts/{path}", **kwargs)

    def list_alert_channels(self) -> models.ChannelList:
        return models.ChannelList.model_validate(self.alert_request("GET", "channels"))

    def add_alert_channel(
        self, name: str, kind: str, config: dict[str, Any]
    ) -> models.ChannelPublic:
        body = {"name": name, "kind": kind, "config": config}
        return models.ChannelPublic.model_validate(
            self.alert_request("POST", "channels", json=body)
        )

    def change_alert_channel(self, name: str, change: models.ChannelChange) -> models.ChannelPublic:
        """Merge `change` over the channel's settings (PATCH: a null removes one)."""
        answer = self.alert_request("PATCH", f"channels/{url_path(name)}", json=change.model_dump())
        return models.ChannelPublic.model_validate(answer)

    def delete_alert_channel(self, name: str) -> None:
        self.alert_request("DELETE", f"channels/{url_path(name)}")

    def test_alert_channel(self, name: str) -> models.AlertDelivery:
        answer = self.alert_request("POST", f"channels/{url_path(name)}/test")
        return models.AlertDelivery.model_validate(answer)

    def list_alert_rules(self) -> models.RuleList:
        return models.RuleList.model_validate(self.alert_request("GET", "rules"))

    def add_alert_rule(self, rule: models.RuleCreate) -> models.RulePublic:
        answer = self.alert_request("POST", "rules", json=rule.model_dump())
        return models.RulePublic.model_validate(answer)

    def set_alert_rule_enabled(self, name: str, enabled: bool) -> models.RulePublic:
        answer = self.alert_request("PATCH", f"rules/{url_path(name)}", json={"enabled": enabled})
        return models.RulePublic.model_validate(answer)

    def delete_alert_rule(self, name: str) -> None:
        self.alert_request("DELETE", f"rules/{url_path(name)}")

    def list_alert_deliveries(
        self, query: models.DeliveryQuery
    ) -> models.Page[models.AlertDelivery]:
        answer = self.alert_request("GET", "deliveries", params=query.params())
        return models.Page[models.AlertDelivery].model_validate(answer)

    def resend_alert_delivery(self, delivery_id: str) -> models.AlertDelivery:
        answer = self.alert_request("POST", f"deliveries/{url_path(delivery_id)}/resend")
        return models.AlertDelivery.model_validate(answer)

    def callback_key(self) -> models.CallbackKey:
        return models.CallbackKey.model_validate(self.alert_request("GET", "callback-key"))

    # -- secrets and keys ----------------------------------------------------------------------

    def list_secrets(self) -> models.Page[models.SecretPublic]:
        result = self.request_json("GET", "/api/v1/secrets")
        return models.Page[models.SecretPublic].model_validate(result)

    def set_secret(self, name: str, value: str) -> models.SecretSet:
        result = self.request_json(
            "PUT", f"/api/v1/secrets/{url_path(name)}", json={"value": value}
        )
        return models.SecretSet.model_validate(result)

    def delete_secret(self, name: str) -> models.SecretDeleted:
        result = self.request_json("DELETE", f"/api/v1/secrets/{url_path(name)}")
        return models.SecretDeleted.model_validate(result)

    def my_key(self) -> models.KeyPublic:
        """The key this client uses (never its value): id, name, scopes, agent."""
        result = self.request_json("GET", "/api/v1/keys/me")
        return models.KeyPublic.model_validate(result)

    def list_keys(self) -> models.Page[models.KeyPublic]:
        result = self.request_json("GET", "/api/v1/keys")
        return models.Page[models.KeyPublic].model_validate(result)

    def create_key(self, *, scopes: list[str], name: str = "") -> models.KeyCreated:
        """A new API key; its plaintext is in "key" and is never returned again."""
        result = self.request_json("POST", "/api/v1/keys", json={"scopes": scopes, "name": name})
        return models.KeyCreated.model_validate(result)

    def revoke_key(self, key_id: str) -> models.KeyPublic:
        result = self.request_json("DELETE", f"/api/v1/keys/{url_path(key_id)}")
        return models.KeyPublic.model_validate(result)

    # -- approvals -----------------------------------------------------------------------------

    def list_approvals(self, query: models.ApprovalQuery) -> models.Page[models.ApprovalPublic]:
        """Approvals oldest first; status pending (default), approved, rejected or all."""
        result = self.request_json("GET", "/api/v1/approvals", params=query.params())
        return models.Page[models.ApprovalPublic].model_validate(result)

    def get_approval(self, approval_id: str) -> models.ApprovalPublic:
        result = self.request_json("GET", f"/api/v1/approvals/{url_path(approval_id)}")
        return models.ApprovalPublic.model_validate(result)

    def approve(
        self,
        approval_id: str,
        *,
        edited: dict[str, Any] | None = None,
        comment: str | None = None,
    ) -> models.ApprovalDecided:
        """Approve; `edited` replaces proposed values (tool arguments or outputs) key by key."""
        body = self._params(edited=edited, comment=comment)
        result = self.request_json(
            "POST", f"/api/v1/approvals/{url_path(approval_id)}/approve", json=body
        )
        return models.ApprovalDecided.model_validate(result)

    def reject(self, approval_id: str, *, comment: str) -> models.ApprovalDecided:
        result = self.request_json(
            "POST", f"/api/v1/approvals/{url_path(approval_id)}/reject", json={"comment": comment}
        )
        return models.ApprovalDecided.model_validate(result)


class _StreamUnavailable(Exception):
    """The server offers no SSE log stream here; polling takes over."""
