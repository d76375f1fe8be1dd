"""REST routes for replays of agent runs from their recordings (exact and what-if) and for
evals over many recorded runs."""

from __future__ import annotations

from typing import Literal

from fastapi import APIRouter
from pydantic import BaseModel, ConfigDict, Field

from floom.api.auth import CtxDep, ReadCaller, RunCaller
from floom.api.openapi import WorkerName, authed
from floom.api.routing import JSONRoute
from floom.schemas import replays as replay_views
from floom.schemas import runs as run_models
from floom.services.replays import evals
from floom.services.replays import replay as replays
from floom.views import runs as views

router = APIRouter(prefix="/api/v1", tags=["replays"], route_class=JSONRoute)


class ReplayStart(BaseModel):
    model_config = ConfigDict(extra="forbid")  # a misspelt field is refused
    mode: Literal["exact", "what_if"] = Field(
        "exact", description="exact: no model, no tool; what_if: the model live, tools recorded"
    )
    version_id: str | None = Field(
        None, max_length=40, description="what_if: the version to test (default: the active one)"
    )
    model: str | None = Field(None, max_length=128, description="what_if: another model")


@router.post(
    "/runs/{run_id}/replays",
    status_code=202,
    response_model=run_models.RunPublic,
    responses=authed(400, 404, 409, 422),
)
def start_replay(
    run_id: str, body: ReplayStart, ctx: CtxDep, caller: RunCaller
) -> run_models.RunPublic:
    run = replays.start_replay(
        ctx,
        run_id=run_id,
        mode=body.mode,
        version_id=body.version_id,
        model=body.model,
        caller=caller,
    )
    return views.run_public(run, artifacts=[], surface=caller.surface)


@router.get(
    "/replays/{run_id}",
    response_model=replay_views.ReplayReport,
    responses=authed(404),
)
def get_replay(run_id: str, ctx: CtxDep, caller: ReadCaller) -> replay_views.ReplayReport:
    return replay_views.replay_report(replays.replay_report(ctx, run_id=run_id, caller=caller))


@router.post(
    "/workers/{name}/evals",
    status_code=202,
    response_model=replay_views.EvalReport,
    responses=authed(400, 404, 409, 422),
)
def start_eval(
    name: WorkerName, body: replay_views.EvalStart, ctx: CtxDep, caller: RunCaller
) -> replay_views.EvalReport:
    row = evals.start_eval(
        ctx,
        worker_name=name,
        selector=body.runs,
        version_id=body.version_id,
        model=body.model,
        caller=caller,
    )
    return replay_views.eval_report(evals.eval_report(ctx, eval_id=row.id, caller=caller))


@router.get("/evals/{eval_id}", response_model=replay_views.EvalReport, responses=authed(404))
def get_eval(eval_id: str, ctx: CtxDep, caller: ReadCaller) -> replay_views.EvalReport:
    return replay_views.eval_report(evals.eval_report(ctx, eval_id=eval_id, caller=caller))
