"""Shared pieces of the public models: the base class, timestamps, pages and the error body."""

from __future__ import annotations

from datetime import datetime
from enum import StrEnum
from typing import Annotated, Any, ClassVar, Generic, TypeVar

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    GetCoreSchemaHandler,
    GetJsonSchemaHandler,
    PlainSerializer,
    SerializerFunctionWrapHandler,
    WithJsonSchema,
    model_serializer,
)
from pydantic.json_schema import JsonSchemaValue
from pydantic_core import core_schema

from floom.errors import RunErrorCode
from floom.vocabulary import (
    ApprovalKind,
    ApprovalStatus,
    ChannelKind,
    DeliveryPurpose,
    DeliveryStatus,
    JobPriority,
    JobStatus,
    NodeState,
    PreviousAttempt,
    RunStatus,
    RunTrigger,
    ToolCallStatus,
    TriggerKind,
)

# ISO 8601 as datetime.isoformat() writes it ("+00:00", not "Z"), which is what every
# client and test has read since the first release.
Timestamp = Annotated[
    datetime,
    PlainSerializer(lambda d: d.isoformat(), return_type=str, when_used="json"),
    WithJsonSchema({"type": "string", "format": "date-time"}),
]
IsoTime = Annotated[str, Field(json_schema_extra={"format": "date-time"})]


class OneOf:
    """Marks a field that holds a word of a closed set (floom/vocabulary.py,
    floom.errors.RunErrorCode): `Annotated[RunStatus, OneOf(RunStatus)]`.

    The value is the enum's member and is sent as its string; the schema is a string with the
    set's values inline, the shape the document always had (no $ref to a component). What
    floom answers with is read leniently: a word this floom does not know (a row a newer node
    wrote) stays the string it is. An argument a caller gives is `strict`: a word outside the
    set is refused as a Literal would refuse it, with the same message."""

    def __init__(self, words: type[StrEnum], *, strict: bool = False) -> None:
        self.words = words
        self.strict = strict

    def __get_pydantic_core_schema__(
        self, source: Any, handler: GetCoreSchemaHandler
    ) -> core_schema.CoreSchema:
        members: dict[str, StrEnum] = {word.value: word for word in self.words}
        values = list(members)
        text = core_schema.literal_schema(values) if self.strict else core_schema.str_schema()
        return core_schema.no_info_after_validator_function(
            lambda value: members.get(value, value), text
        )

    def __get_pydantic_json_schema__(
        self, schema: core_schema.CoreSchema, handler: GetJsonSchemaHandler
    ) -> JsonSchemaValue:
        described = handler(schema)
        described.setdefault("enum", [word.value for word in self.words])
        return described


RunStatusWord = Annotated[RunStatus, OneOf(RunStatus)]
RunTriggerWord = Annotated[RunTrigger, OneOf(RunTrigger)]
RunErrorCodeWord = Annotated[RunErrorCode, OneOf(RunErrorCode)]
TriggerKindWord = Annotated[TriggerKind, OneOf(TriggerKind)]
ApprovalKindWord = Annotated[ApprovalKind, OneOf(ApprovalKind)]
ApprovalStatusWord = Annotated[ApprovalStatus, OneOf(ApprovalStatus)]
ToolCallStatusWord = Annotated[ToolCallStatus, OneOf(ToolCallStatus)]
JobStatusWord = Annotated[JobStatus, OneOf(JobStatus)]
JobPriorityWord = Annotated[JobPriority, OneOf(JobPriority)]
ChannelKindWord = Annotated[ChannelKind, OneOf(ChannelKind)]
DeliveryPurposeWord = Annotated[DeliveryPurpose, OneOf(DeliveryPurpose)]
DeliveryStatusWord = Annotated[DeliveryStatus, OneOf(DeliveryStatus)]
NodeStateWord = Annotated[NodeState, OneOf(NodeState)]
PreviousAttemptWord = Annotated[PreviousAttempt, OneOf(PreviousAttempt)]


class Public(BaseModel):
    """A public model. Fields named in `omit_when_unset` appear only when the builder gave
    them (a schedule's next fires, a run's artifacts): the shape says what a body may carry,
    and no body grows null keys it never had."""

    model_config = ConfigDict(extra="ignore")
    omit_when_unset: ClassVar[frozenset[str]] = frozenset()

    @model_serializer(mode="wrap")
    def _omit_unset(self, handler: SerializerFunctionWrapHandler) -> Any:
        data = handler(self)
        if self.omit_when_unset and isinstance(data, dict):
            for name in self.omit_when_unset - self.model_fields_set:
                data.pop(name, None)
        return data

    def to_json(self) -> dict[str, Any]:
        """The body as JSON values, as the REST API sends it."""
        body: dict[str, Any] = self.model_dump(mode="json")
        return body


T = TypeVar("T")


class Page(Public, Generic[T]):
    """A list of items; `next_cursor` is passed back as `cursor` for the next page, and is
    null on the last one."""

    items: list[T]
    next_cursor: str | None


class ErrorDetail(Public):
    code: str = Field(description="stable; clients branch on it, never on the message")
    message: str
    hint: str | None = Field(description="how to fix it, when floom knows")
    details: Any = Field(None, description="structured extra facts, only on some codes")

    omit_when_unset = frozenset({"details"})


class ErrorBody(Public):
    """Every refusal and failure: one shape, whatever the status."""

    error: ErrorDetail
