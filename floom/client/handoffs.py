"""REST calls of the handoff layer (agents, roles, jobs) over a FloomClient; used by the CLI
and usable by any thin client (the stdio MCP server). Failures are floom.errors.FloomError."""

from __future__ import annotations

from typing import Any

from floom.client.rest import FloomClient, models, url_path

JSON = dict[str, Any]
JOBS = "/api/v1/handoffs/jobs"


class HandoffClient:
    """The handoff layer's calls; each answers the public model of floom/schemas/handoffs.py
    (loaded at the first call, as floom.client.rest's are: see floom/client/models.py)."""

    def __init__(self, client: FloomClient) -> None:
        self.client = client

    def _call(self, method: str, path: str, **kwargs: Any) -> Any:
        return self.client.request_json(method, path, **kwargs)

    @staticmethod
    def _drop_none(**values: Any) -> JSON:
        return {k: v for k, v in values.items() if v is not None}

    # -- roles and agents ------------------------------------------------------------------

    def list_roles(self, *, include_retired: bool = False) -> models.Page[models.RolePublic]:
        return models.Page[models.RolePublic].model_validate(
            self._call("GET", "/api/v1/roles", params={"include_retired": include_retired})
        )

    def create_role(self, name: str, *, description: str = "") -> models.RolePublic:
        return models.RolePublic.model_validate(
            self._call("POST", "/api/v1/roles", json={"name": name, "description": description})
        )

    def update_role(
        self, role: str, *, name: str | None = None, description: str | None = None
    ) -> models.RolePublic:
        body = self._drop_none(name=name, description=description)
        return models.RolePublic.model_validate(
            self._call("PATCH", f"/api/v1/roles/{url_path(role)}", json=body)
        )

    def retire_role(self, role: str) -> models.RolePublic:
        return models.RolePublic.model_validate(
            self._call("POST", f"/api/v1/roles/{url_path(role)}/retire")
        )

    def list_agents(self, *, include_retired: bool = False) -> models.Page[models.AgentPublic]:
        return models.Page[models.AgentPublic].model_validate(
            self._call("GET", "/api/v1/agents", params={"include_retired": include_retired})
        )

    def create_agent(
        self, label: str, *, roles: list[str], tool_family: str = "", scopes: list[str]
    ) -> models.AgentCreated:
        body = {"label": label, "roles": roles, "tool_family": tool_family, "scopes": scopes}
        return models.AgentCreated.model_validate(self._call("POST", "/api/v1/agents", json=body))

    def update_agent(self, agent: str, *, roles: list[str] | None = None) -> models.AgentPublic:
        return models.AgentPublic.model_validate(
            self._call("PATCH", f"/api/v1/agents/{url_path(agent)}", json={"roles": roles})
        )

    def retire_agent(self, agent: str) -> models.AgentPublic:
        return models.AgentPublic.model_validate(
            self._call("POST", f"/api/v1/agents/{url_path(agent)}/retire")
        )

    def whoami(self) -> models.WhoAmI:
        return models.WhoAmI.model_validate(self._call("GET", "/api/v1/handoffs/me"))

    # -- jobs ------------------------------------------------------------------------------

    def list_jobs(self, query: models.JobQuery) -> models.Page[models.JobPublic]:
        return models.Page[models.JobPublic].model_validate(
            self._call("GET", JOBS, params=query.params())
        )

    def get_job(self, job_id: str, *, events: bool = False) -> models.JobPublic:
        return models.JobPublic.model_validate(
            self._call("GET", f"{JOBS}/{url_path(job_id)}", params={"events": events})
        )

    def create_job(self, job: models.JobRequest) -> models.JobPublic:
        body = job.model_dump(exclude_none=True)
        return models.JobPublic.model_validate(self._call("POST", JOBS, json=body))

    def update_job(
        self, job_id: str, *, context: JSON | None = None, constraints: list[str] | None = None
    ) -> models.JobPublic:
        body = self._drop_none(context=context, constraints=constraints)
        return models.JobPublic.model_validate(
            self._call("PATCH", f"{JOBS}/{url_path(job_id)}", json=body)
        )

    def claim(self, job_id: str, *, lease_seconds: float | None = None) -> models.JobPublic:
        body = self._drop_none(lease_seconds=lease_seconds)
        return models.JobPublic.model_validate(
            self._call("POST", f"{JOBS}/{url_path(job_id)}/claim", json=body)
        )

    def claim_next(
        self, *, role: str | None = None, lease_seconds: float | None = None
    ) -> models.ClaimNextResult:
        body = self._drop_none(role=role, lease_seconds=lease_seconds)
        return models.ClaimNextResult.model_validate(
            self._call("POST", "/api/v1/handoffs/claim-next", json=body)
        )

    def heartbeat(self, job_id: str, *, lease_seconds: float | None = None) -> models.LeaseState:
        body = self._drop_none(lease_seconds=lease_seconds)
        return models.LeaseState.model_validate(
            self._call("POST", f"{JOBS}/{url_path(job_id)}/heartbeat", json=body)
        )

    def set_status(
        self,
        job_id: str,
        status: str,
        *,
        reason: str | None = None,
        lease_seconds: float | None = None,
    ) -> models.JobPublic:
        body = self._drop_none(status=status, reason=reason, lease_seconds=lease_seconds)
        return models.JobPublic.model_validate(
            self._call("POST", f"{JOBS}/{url_path(job_id)}/status", json=body)
        )

    def complete(
        self,
        job_id: str,
        *,
        summary: str = "",
        data: JSON | None = None,
        artifacts: list[JSON] | None = None,
    ) -> models.JobPublic:
        body = {"summary": summary, "data": data or {}, "artifacts": artifacts or []}
        return models.JobPublic.model_validate(
            self._call("POST", f"{JOBS}/{url_path(job_id)}/complete", json=body)
        )

    def reject(
        self, job_id: str, *, reason: str, role: str | None = None, priority: str | None = None
    ) -> models.JobPublic:
        body = self._drop_none(reason=reason, role=role, priority=priority)
        return models.JobPublic.model_validate(
            self._call("POST", f"{JOBS}/{url_path(job_id)}/reject", json=body)
        )

    def reopen_context(self, job_id: str) -> models.ReopenContext:
        return models.ReopenContext.model_validate(
            self._call("GET", f"{JOBS}/{url_path(job_id)}/reopen-context")
        )
