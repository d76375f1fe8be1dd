"""A node's ceilings on worker.yml's limits: what an operator lets one run ask for.

Each of a run's limits has a setting (FLOOM_MAX_MEMORY_MB, ...; unset: no ceiling beyond
worker.yml's own bounds). A worker whose limit, as written or by its default, is over a
ceiling is refused at deploy (400 `manifest_invalid`, a problem at the limit's path naming
the value asked, the ceiling and its setting), and validate reports the same problem.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Final

from floom.config import LIMIT_CEILINGS
from floom.manifest.schema import Manifest, Problem

if TYPE_CHECKING:
    from floom.config import Settings


@dataclass(frozen=True)
class Ceiling:
    """The ceiling on `limits.<key>`, from the setting `attribute` (FLOOM_ + its upper case)."""

    key: str
    attribute: str
    unit: str

    @property
    def variable(self) -> str:
        return f"FLOOM_{self.attribute.upper()}"


UNITS: Final = {
    "timeout_seconds": "seconds",
    "memory_mb": "MiB",
    "processes": "processes",
    "cpu": "cores",
    "disk_mb": "MiB",
    "max_tool_iterations": "model turns",
}
CEILINGS: Final = tuple(
    Ceiling(key, setting, UNITS[key]) for key, setting in LIMIT_CEILINGS.items()
)


def over_ceilings(manifest: Manifest, settings: Settings) -> list[Problem]:
    """A problem for each of the manifest's limits over this node's ceiling."""
    problems = []
    for ceiling in CEILINGS:
        top = getattr(settings, ceiling.attribute)
        asked = getattr(manifest.limits, ceiling.key)
        if ceiling.key == "max_tool_iterations" and asked is None:
            continue  # unset: the node's own FLOOM_AGENT_MAX_ITERATIONS
        if top is None or asked is None or asked <= top:
            continue
        written = ceiling.key in manifest.limits.model_fields_set
        problems.append(
            Problem(
                f"limits.{ceiling.key}",
                f"asks for {_figure(asked)} {ceiling.unit}"
                f"{'' if written else ' (the default)'}, over this server's ceiling of "
                f"{_figure(top)} {ceiling.unit} ({ceiling.variable})",
                f"set limits.{ceiling.key} to {_figure(top)} or less in worker.yml, or ask "
                f"the server's operator to raise {ceiling.variable}",
            )
        )
    asked_state, top_state = manifest.state.max_bytes, settings.max_state_bytes
    if manifest.state.enabled and asked_state is not None and asked_state > top_state:
        problems.append(
            Problem(
                "state.max_bytes",
                f"asks for {asked_state} bytes, over this server's ceiling of {top_state} "
                "bytes (FLOOM_MAX_STATE_BYTES)",
                f"set state.max_bytes to {top_state} or less in worker.yml, or ask the "
                "server's operator to raise FLOOM_MAX_STATE_BYTES",
            )
        )
    return problems


def _figure(value: float) -> str:
    return f"{value:g}" if isinstance(value, float) else str(value)
