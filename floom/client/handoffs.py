"""REST calls of the handoff layer (agents, roles, jobs) over a FloomClient; used by the CLI
and usable by any thin client (the stdio MCP server). Failures are floom.errors.FloomError."""

from __future__ import annotations

from typing import Any

from floom.client.rest import FloomClient, url_path

JSON = dict[str, Any]
JOBS = "/api/v1/handoffs/jobs"


class HandoffClient:
    def __init__(self, client: FloomClient) -> None:
        self.client = client

    def _call(self, method: str, path: str, **kwargs: Any) -> JSON:
        result: JSON = self.client.request_json(method, path, **kwargs)
        return result

    @staticmethod
    def _drop_none(**values: Any) -> JSON:
        return {k: v for k, v in values.items() if v is not None}

    # -- roles and agents ------------------------------------------------------------------

    def list_roles(self, *, include_retired: bool = False) -> JSON:
        return self._call("GET", "/api/v1/roles", params={"include_retired": include_retired})

    def create_role(self, name: str, *, description: str = "") -> JSON:
        return self._call("POST", "/api/v1/roles", json={"name": name, "description": description})

    def update_role(
        self, role: str, *, name: str | None = None, description: str | None = None
    ) -> JSON:
        body = self._drop_none(name=name, description=description)
        return self._call("PATCH", f"/api/v1/roles/{url_path(role)}", json=body)

    def retire_role(self, role: str) -> JSON:
        return self._call("POST", f"/api/v1/roles/{url_path(role)}/retire")

    def list_agents(self, *, include_retired: bool = False) -> JSON:
        return self._call("GET", "/api/v1/agents", params={"include_retired": include_retired})

    def create_agent(
        self, label: str, *, roles: list[str], tool_family: str = "", scopes: list[str]
    ) -> JSON:
        body = {"label": label, "roles": roles, "tool_family": tool_family, "scopes": scopes}
        return self._call("POST", "/api/v1/agents", json=body)

    def update_agent(self, agent: str, *, roles: list[str] | None = None) -> JSON:
        return self._call("PATCH", f"/api/v1/agents/{url_path(agent)}", json={"roles": roles})

    def retire_agent(self, agent: str) -> JSON:
        return self._call("POST", f"/api/v1/agents/{url_path(agent)}/retire")

    def whoami(self) -> JSON:
        return self._call("GET", "/api/v1/handoffs/me")

    # -- jobs ------------------------------------------------------------------------------

    def list_jobs(self, **filters: Any) -> JSON:
        return self._call("GET", JOBS, params=self._drop_none(**filters))

    def get_job(self, job_id: str, *, events: bool = False) -> JSON:
        return self._call("GET", f"{JOBS}/{url_path(job_id)}", params={"events": events})

    def create_job(self, **body: Any) -> JSON:
        return self._call("POST", JOBS, json=self._drop_none(**body))

    def update_job(
        self, job_id: str, *, context: JSON | None = None, constraints: list[str] | None = None
    ) -> JSON:
        body = self._drop_none(context=context, constraints=constraints)
        return self._call("PATCH", f"{JOBS}/{url_path(job_id)}", json=body)

    def claim(self, job_id: str, *, lease_seconds: float | None = None) -> JSON:
        body = self._drop_none(lease_seconds=lease_seconds)
        return self._call("POST", f"{JOBS}/{url_path(job_id)}/claim", json=body)

    def claim_next(self, *, role: str | None = None, lease_seconds: float | None = None) -> JSON:
        body = self._drop_none(role=role, lease_seconds=lease_seconds)
        return self._call("POST", "/api/v1/handoffs/claim-next", json=body)

    def heartbeat(self, job_id: str, *, lease_seconds: float | None = None) -> JSON:
        body = self._drop_none(lease_seconds=lease_seconds)
        return self._call("POST", f"{JOBS}/{url_path(job_id)}/heartbeat", json=body)

    def set_status(
        self,
        job_id: str,
        status: str,
        *,
        reason: str | None = None,
        lease_seconds: float | None = None,
    ) -> JSON:
        body = self._drop_none(status=status, reason=reason, lease_seconds=lease_seconds)
        return self._call("POST", f"{JOBS}/{url_path(job_id)}/status", json=body)

    def complete(
        self,
        job_id: str,
        *,
        summary: str = "",
        data: JSON | None = None,
        artifacts: list[JSON] | None = None,
    ) -> JSON:
        body = {"summary": summary, "data": data or {}, "artifacts": artifacts or []}
        return self._call("POST", f"{JOBS}/{url_path(job_id)}/complete", json=body)

    def reject(
        self, job_id: str, *, reason: str, role: str | None = None, priority: str | None = None
    ) -> JSON:
        body = self._drop_none(reason=reason, role=role, priority=priority)
        return self._call("POST", f"{JOBS}/{url_path(job_id)}/reject", json=body)

    def reopen_context(self, job_id: str) -> JSON:
        return self._call("GET", f"{JOBS}/{url_path(job_id)}/reopen-context")
