"""Workers, their versions, deploys and validation, as answered."""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any, Self

from pydantic import Field

from floom import jsonvalues
from floom.hints import Surface, Told
from floom.hints.surface import render
from floom.schemas.common import IsoTime, Public, Timestamp
from floom.schemas.runs import RunPublic
from floom.vocabulary import StateSource

if TYPE_CHECKING:
    from floom.manifest.schema import Manifest
    from floom.services.workers.deletion import Deletion
    from floom.services.workers.versions import Validation
    from floom.store.models import Version, Worker, WorkerState

RECENT_RUNS = 10


class TriggerSummary(Public):
    """A trigger as worker listings show it; schedules add their cron, zone and next fire."""

    id: str
    kind: str
    paused: bool
    active: bool = Field(description="false while the trigger or its worker is paused")
    cron: str | None = None
    timezone: str | None = None
    next_fire: IsoTime | None = None

    omit_when_unset = frozenset({"cron", "timezone", "next_fire"})


class WorkerPublic(Public):
    """A worker; the title, description, kind and manifest are those of its active version,
    present when it has one."""

    name: str
    active_version_id: str | None
    paused: bool
    created_at: Timestamp
    updated_at: Timestamp
    title: str | None = None
    description: str | None = None
    kind: str | None = Field(None, json_schema_extra={"enum": ["script", "agent"]})
    manifest: dict[str, Any] | None = Field(None, description="worker.yml as JSON")
    triggers: list[TriggerSummary]

    omit_when_unset = frozenset({"title", "description", "kind", "manifest"})

    @classmethod
    def of(
        cls,
        worker: Worker,
        *,
        version: Version | None,
        manifest: Manifest | None,
        triggers: list[TriggerSummary],
        unreadable: str | None = None,
        **extra: Any,
    ) -> Self:
        """The worker; with its active `version` and that version's parsed `manifest`, their
        title, description, kind and manifest. A version whose stored worker.yml cannot be read
        back (`unreadable` says why) is listed with its kind and its manifest marked."""
        if version is not None and unreadable is not None:
            extra.update(kind=version.kind, manifest=jsonvalues.unreadable(unreadable))
        if version is not None and manifest is not None:
            extra.update(
                title=manifest.title,
                description=manifest.description,
                kind=manifest.kind,
                manifest=jsonvalues.stored(version.manifest_json, expect=dict),
            )
        return cls(
            name=worker.name,
            active_version_id=worker.active_version_id,
            paused=worker.paused,
            created_at=worker.created_at,
            updated_at=worker.updated_at,
            triggers=triggers,
            **extra,
        )


class WorkerDetail(WorkerPublic):
    recent_runs: list[RunPublic] = Field(description=f"the last {RECENT_RUNS} runs, newest first")
    secrets_missing: list[str] = Field(
        default_factory=list,
        description="secrets the active version declares that are not set: its runs fail "
        "until they are (told to a key with the deploy scope, which may see secret names)",
    )

    model_key_missing: bool = Field(
        False,
        description="an agent worker whose runs fail until the floom server that runs agents "
        "has a model provider key (FLOOM_ANTHROPIC_API_KEY); said by a node that runs agents",
    )

    omit_when_unset = WorkerPublic.omit_when_unset | {"secrets_missing", "model_key_missing"}


class VersionPublic(Public):
    id: str
    worker: str
    digest: str = Field(description="sha256 of the normalised archive")
    kind: str = Field(json_schema_extra={"enum": ["script", "agent"]})
    file_count: int
    size: int
    created_at: Timestamp
    active: bool

    @classmethod
    def of(cls, version: Version, *, active_id: str | None, **extra: Any) -> Self:
        return cls(
            id=version.id,
            worker=version.worker_name,
            digest=version.digest,
            kind=version.kind,
            file_count=version.file_count,
            size=version.size,
            created_at=version.created_at,
            active=version.id == active_id,
            **extra,
        )


class VersionFile(Public):
    path: str
    size: int


class VersionDetail(VersionPublic):
    manifest_yaml: str
    files: list[VersionFile]


class FileDiff(Public):
    path: str
    status: str = Field(json_schema_extra={"enum": ["added", "removed", "changed", "unchanged"]})
    old_size: int | None = Field(description="null when the file was added")
    new_size: int | None = Field(description="null when the file was removed")
    lines: list[str] = Field(
        description="the unified diff without its ---/+++ header; empty for binary or large files"
    )
    text: bool = Field(description="false for binary or large files, which are not diffed")


class VersionDiff(Public):
    """What changed between two versions of one worker: worker.yml first, then every file by
    path."""

    worker: str
    old: VersionPublic
    new: VersionPublic
    files: list[FileDiff]

    @property
    def changed(self) -> list[FileDiff]:
        return [f for f in self.files if f.status != "unchanged"]


class DeployResult(Public):
    worker: WorkerPublic
    version: VersionPublic
    created: bool = Field(description="false when the same content was deployed before")
    activated: bool
    left_out: list[str] = Field(
        default_factory=list,
        description="files of the upload no version ships, each with why: environment files "
        "(`.env`, `.env.*` at any depth; `.env.example` ships) and FIFOs or devices",
    )


class RollbackResult(Public):
    worker: WorkerPublic
    version: VersionPublic
    changed: bool = Field(
        default=True, description="false when that version was already the active one"
    )


class ProblemPublic(Public):
    path: str = Field(description='where in worker.yml ("" is the whole document)')
    message: str
    hint: str | None


class ValidationResult(Public):
    valid: bool
    problems: list[ProblemPublic]
    manifest: dict[str, Any] | None = Field(description="the parsed manifest, when it parses")
    left_out: list[str] = Field(
        default_factory=list,
        description="files of the upload no version ships, each with why: environment files "
        "(`.env`, `.env.*` at any depth; `.env.example` ships) and FIFOs or devices",
    )

    @classmethod
    def of(cls, validation: Validation, *, surface: Surface) -> Self:
        """The result, each problem's hint in the terms of the caller's `surface`."""
        manifest, problems = validation.manifest, validation.problems
        return cls(
            valid=not problems,
            problems=[
                ProblemPublic(path=p.path, message=p.message, hint=render(p.hint, surface=surface))
                for p in problems
            ],
            manifest=manifest.model_dump(mode="json") if manifest else None,
            left_out=left_out_said(validation.left_out, surface=surface),
        )


def left_out_said(left_out: Sequence[Told], *, surface: Surface) -> list[str]:
    return [render(why, surface=surface) or "" for why in left_out]


class WorkerDeleted(Public):
    """What a deletion did; the same record is kept as an audit event."""

    deleted: bool
    worker: str
    deletion_id: str
    purge_runs: bool
    versions: list[str]
    active_version_id: str | None
    runs_kept: int
    runs_purged: int
    runs_cancelled: int
    runs_stopping: int = Field(description="running runs asked to stop; they end shortly")
    triggers_removed: int
    approvals_closed: int
    webhook_deliveries_deleted: int
    blobs_deleted: int

    @classmethod
    def of(cls, deletion: Deletion) -> Self:
        return cls.model_validate({"deleted": True, **deletion.to_dict()})


# -- worker state -------------------------------------------------------------------------------


class StateVersionPublic(Public):
    """One kept version of a worker's state: who wrote it, when, from which run."""

    worker: str
    version: int
    size: int = Field(description="bytes of JSON")
    source: str = Field(
        json_schema_extra={"enum": list(StateSource)},
        description="run: a run's success; operator: set by a key; restore: an earlier "
        "version set again (restored_from)",
    )
    written_by: str | None = Field(description='"run:<id>" or the key that set it')
    run_id: str | None
    restored_from: int | None
    created_at: Timestamp

    @classmethod
    def of(cls, row: WorkerState) -> Self:
        return cls(
            worker=row.worker_name,
            version=row.version,
            size=row.size,
            source=row.source,
            written_by=row.written_by,
            run_id=row.run_id,
            restored_from=row.restored_from,
            created_at=row.created_at,
        )


class WorkerStatePublic(Public):
    """A worker's state: the current version (0 before the first), and the value and record
    of the version asked for (the current one unless `version` was given)."""

    worker: str
    enabled: bool = Field(description="whether the worker's active version declares state")
    limit_bytes: int = Field(description="the largest state this worker may keep, as JSON")
    current_version: int
    version: int
    state: Any = Field(description="the value; null before the first state")
    written: StateVersionPublic | None = Field(description="null before the first state")
