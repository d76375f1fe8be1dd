"""Shared pieces of the public models: the base class, timestamps, pages and the error body."""

from __future__ import annotations

from datetime import datetime
from typing import Annotated, Any, ClassVar, Generic, TypeVar

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    PlainSerializer,
    SerializerFunctionWrapHandler,
    WithJsonSchema,
    model_serializer,
)

# ISO 8601 as datetime.isoformat() writes it ("+00:00", not "Z"), which is what every
# client and test has read since the first release.
Timestamp = Annotated[
    datetime,
    PlainSerializer(lambda d: d.isoformat(), return_type=str, when_used="json"),
    WithJsonSchema({"type": "string", "format": "date-time"}),
]
IsoTime = Annotated[str, Field(json_schema_extra={"format": "date-time"})]


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
