"""The run form of a worker, generated from its declared inputs, and the way back from the
posted text fields to the inputs a run takes (the manifest then checks them by type)."""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Literal

from starlette.datastructures import FormData

from floom.manifest.schema import FieldSpec, Manifest

Widget = Literal["text", "integer", "number", "checkbox", "select", "json"]


@dataclass(frozen=True)
class FormField:
    name: str
    type: str
    widget: Widget
    required: bool
    description: str
    value: str = ""
    checked: bool = False
    options: list[tuple[str, str]] = field(default_factory=list)
    problem: str | None = None

    @property
    def input_id(self) -> str:
        return f"input-{self.name}"


def _as_text(value: Any) -> str:
    if value is None:
        return ""
    if isinstance(value, str):
        return value
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, dict | list):
        return json.dumps(value, indent=2, ensure_ascii=False)
    return json.dumps(value)


def _widget(spec: FieldSpec) -> Widget:
    if spec.enum:
        return "select"
    if spec.type == "boolean":
        return "checkbox"
    if spec.type in ("object", "array"):
        return "json"
    if spec.type in ("integer", "number"):
        return spec.type
    return "text"


def run_form(
    manifest: Manifest,
    submitted: Mapping[str, str] | None = None,
    problems: Mapping[str, str] | None = None,
) -> list[FormField]:
    """One field per declared input, filled with what was submitted, else the default."""
    fields = []
    for name, spec in manifest.inputs.items():
        widget = _widget(spec)
        text = submitted[name] if submitted and name in submitted else _as_text(spec.default)
        options: list[tuple[str, str]] = []
        if widget == "select":
            if spec.default is None:
                options.append(("", "— choose —" if spec.required else "— none —"))
            options += [(_as_text(v), _as_text(v)) for v in spec.enum or []]
        fields.append(
            FormField(
                name=name,
                type=spec.type,
                widget=widget,
                required=spec.required and spec.default is None,
                description=spec.description,
                value=text,
                checked=text.strip().lower() in ("true", "yes", "1"),
                options=options,
                problem=(problems or {}).get(name),
            )
        )
    return fields


def submitted_text(manifest: Manifest, form: FormData) -> dict[str, str]:
    """The posted text of each declared input. A checkbox posts a hidden "false" first and
    "true" after it when ticked, so the last value wins and unticking can say false."""
    values: dict[str, str] = {}
    for name in manifest.inputs:
        posted = [v for v in form.getlist(name) if isinstance(v, str)]
        if posted:
            values[name] = posted[-1]
    return values


def inputs_from_text(values: Mapping[str, str]) -> dict[str, str]:
    """Blank fields are left out, so defaults and the required check apply to them."""
    return {name: text for name, text in values.items() if text.strip()}


def problems_by_input(details: Any) -> dict[str, str]:
    """InputInvalid details ({"path": "inputs.x", ...}) keyed by input name, for the form."""
    found: dict[str, str] = {}
    if isinstance(details, list):
        for item in details:
            if isinstance(item, dict) and str(item.get("path", "")).startswith("inputs."):
                name = str(item["path"]).removeprefix("inputs.")
                hint = f" ({item['hint']})" if item.get("hint") else ""
                found[name] = f"{item.get('message', 'not valid')}{hint}"
    return found
