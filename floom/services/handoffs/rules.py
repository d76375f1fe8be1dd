"""The rules of handoff jobs that need no database: statuses and the one transition table,
priorities, the shape of artifacts and routing rules, and the routing condition language."""

from __future__ import annotations

import json
import math
import re
from collections.abc import Iterable
from typing import Any

from floom import jsonvalues
from floom.errors import Forbidden, IllegalTransition, InvalidRequest, quoted
from floom.services.names import check_text_name
from floom.vocabulary import JobPriority, JobStatus

PENDING = JobStatus.PENDING
PUBLISHED = JobStatus.PUBLISHED
IN_PROGRESS = JobStatus.IN_PROGRESS
BLOCKED = JobStatus.BLOCKED
COMPLETED = JobStatus.COMPLETED
FAILED = JobStatus.FAILED
CANCELLED = JobStatus.CANCELLED
STATUSES: tuple[JobStatus, ...] = tuple(JobStatus)
TERMINAL = frozenset({COMPLETED, FAILED, CANCELLED})

# Who may make a move. Admins may make every move that is not floom's alone.
SYSTEM = "system"  # floom itself: dependency resolution, lease expiry
SOURCE = "source"  # the agent that published the job
ASSIGNEE = "assignee"  # the agent holding the job
ROLE = "role"  # any agent holding the job's target role (a claim)

# The one table of allowed status changes, enforced for every caller (REST, MCP, UI, bridge).
TRANSITIONS: dict[JobStatus, dict[JobStatus, frozenset[str]]] = {
    PENDING: {
        PUBLISHED: frozenset({SYSTEM}),
        FAILED: frozenset({SYSTEM}),
        CANCELLED: frozenset({SOURCE}),
    },
    PUBLISHED: {
        IN_PROGRESS: frozenset({ROLE}),
        CANCELLED: frozenset({SOURCE}),
    },
    IN_PROGRESS: {
        BLOCKED: frozenset({ASSIGNEE}),
        COMPLETED: frozenset({ASSIGNEE}),
        FAILED: frozenset({ASSIGNEE}),
        CANCELLED: frozenset({SOURCE, ASSIGNEE}),
        PUBLISHED: frozenset({ASSIGNEE, SYSTEM}),  # released, or the lease expired
    },
    BLOCKED: {
        IN_PROGRESS: frozenset({ASSIGNEE}),  # unblocked
        PUBLISHED: frozenset({ASSIGNEE}),
        FAILED: frozenset({ASSIGNEE}),
        CANCELLED: frozenset({SOURCE, ASSIGNEE}),
    },
    COMPLETED: {},
    FAILED: {},
    CANCELLED: {},
}

PRIORITIES: tuple[JobPriority, ...] = tuple(JobPriority)
PRIORITY_RANK = {p: i for i, p in enumerate(PRIORITIES)}

MAX_SUMMARY = 500
MAX_CONSTRAINT_CHARS = 2000
MAX_REASON_CHARS = 4000
MAX_JSON_BYTES = 256 * 1024
MAX_CONSTRAINTS = 100
MAX_ARTIFACTS = 100
MAX_RULES = 20
MAX_CONDITION_DEPTH = 8
CONDITION_OPS = ("equals", "not_equals", "in", "contains", "exists", "gt", "gte", "lt", "lte")


def allowed_targets(status: JobStatus, *, parties: Iterable[str], admin: bool) -> list[JobStatus]:
    """The statuses a caller with these parties to the job may move it to from `status`."""
    who = set(parties)
    return [
        to
        for to, may in TRANSITIONS.get(status, {}).items()
        if who & may or (admin and may - {SYSTEM})
    ]


def check_transition(current: JobStatus, new: str, *, parties: set[str], admin: bool) -> JobStatus:
    """Refuse a move the table does not allow, naming the allowed ones; or one this caller
    may not make, naming who may. Returns the status moved to."""
    if new not in STATUSES:
        raise InvalidRequest(
            f"unknown status '{quoted(new)}'", hint=f"one of {', '.join(STATUSES)}"
        )
    to = JobStatus(new)
    moves = TRANSITIONS[current]
    if to not in moves:
        allowed = list(moves)
        raise IllegalTransition(
            f"a {current} job cannot move to {new}",
            hint=f"from {current} it can move to {', '.join(allowed)}"
            if allowed
            else f"{current} is final; reject a completed job to get a linked retry",
            details={"from": current, "to": new, "allowed": allowed},
        )
    may = moves[to]
    if parties & may or (admin and may - {SYSTEM}):
        return to
    if may == {SYSTEM}:
        why = "floom makes this move itself (when dependencies resolve or a lease expires)"
    else:
        names = {SOURCE: "the agent that published it", ASSIGNEE: "its assignee"}
        names[ROLE] = "an agent holding its target role"
        why = "only " + " or ".join(names[p] for p in sorted(may)) + " (or an admin)"
    raise Forbidden(
        f"you may not move this job from {current} to {new}: {why} may",
        hint="use the key of the agent concerned",
        details={
            "from": current,
            "to": new,
            "allowed": allowed_targets(current, parties=parties, admin=admin),
        },
    )


# -- validation of job parts -----------------------------------------------------------------


def check_summary(summary: Any) -> str:
    if not isinstance(summary, str) or not summary.strip():
        raise InvalidRequest("a job needs a summary", hint="one line saying what is to be done")
    if len(summary) > MAX_SUMMARY:
        raise InvalidRequest(
            f"the summary is {len(summary)} characters; at most {MAX_SUMMARY}",
            hint="put the details into the context",
        )
    # One line, shown in every list of jobs: a newline or a bidirectional override in it
    # would let one job pass for another there.
    check_text_name(summary, field="summary", most=MAX_SUMMARY, kept_as="a job's one-line summary")
    return summary.strip()


def check_reason(reason: Any, *, required: bool = False) -> str | None:
    """A reason given for a status change or a rejection: text of at most MAX_REASON_CHARS
    (it is kept on the job and in its audit trail)."""
    if reason is None and not required:
        return None
    if not isinstance(reason, str) or (required and not reason.strip()):
        raise InvalidRequest("a rejection needs a reason", hint="say what must change")
    if len(reason) > MAX_REASON_CHARS:
        raise InvalidRequest(
            f"the reason is {len(reason)} characters; at most {MAX_REASON_CHARS}",
            hint="say it in short; put the details into an artifact",
        )
    return reason


def check_priority(priority: Any) -> JobPriority:
    # Any JSON value can arrive here; a list or an object must be refused, not hashed.
    if not isinstance(priority, str) or priority not in PRIORITY_RANK:
        raise InvalidRequest(
            f"unknown priority {quoted(repr(priority))}", hint=f"one of {', '.join(PRIORITIES)}"
        )
    return JobPriority(priority)


def encode_json(value: Any, *, what: str) -> str:
    jsonvalues.check(value, where=f"the {what}")
    text = json.dumps(value, separators=(",", ":"), allow_nan=False)
    if len(text.encode()) > MAX_JSON_BYTES:
        raise InvalidRequest(
            f"the {what} is larger than {MAX_JSON_BYTES // 1024} KiB",
            hint="store large material as an artifact and put its uri here",
        )
    return text


def check_context(context: Any) -> dict[str, Any]:
    if context is None:
        return {}
    if not isinstance(context, dict):
        raise InvalidRequest("the context must be a JSON object", hint='e.g. {"repo": "..."}')
    encode_json(context, what="context")
    return context


def check_constraints(constraints: Any) -> list[str]:
    if constraints is None:
        return []
    if not isinstance(constraints, list) or not all(isinstance(c, str) for c in constraints):
        raise InvalidRequest("constraints must be a list of text", hint='e.g. ["no new deps"]')
    if len(constraints) > MAX_CONSTRAINTS:
        raise InvalidRequest(f"at most {MAX_CONSTRAINTS} constraints", hint="merge some")
    for i, c in enumerate(constraints):
        if len(c) > MAX_CONSTRAINT_CHARS:
            raise InvalidRequest(
                f"constraints[{i}] is {len(c)} characters; at most {MAX_CONSTRAINT_CHARS}",
                hint="state each constraint in short; put the details into the context",
            )
    return [c.strip() for c in constraints if c.strip()]


def check_artifacts(artifacts: Any) -> list[dict[str, Any]]:
    if artifacts is None:
        return []
    if not isinstance(artifacts, list) or len(artifacts) > MAX_ARTIFACTS:
        raise InvalidRequest(
            f"artifacts must be a list of at most {MAX_ARTIFACTS} objects",
            hint='e.g. [{"type": "file", "uri": "s3://bucket/report.md"}]',
        )
    clean = []
    for i, item in enumerate(artifacts):
        where = f"artifacts[{i}]"
        if not isinstance(item, dict):
            raise InvalidRequest(f"{where} must be an object", hint="with type and uri")
        unknown = set(item) - {"type", "uri", "checksum", "metadata"}
        if unknown:
            raise InvalidRequest(
                f"{where} has unknown field(s) {', '.join(sorted(unknown))}",
                hint="an artifact has type, uri, checksum and metadata",
            )
        for name in ("type", "uri"):
            if not isinstance(item.get(name), str) or not item[name].strip():
                raise InvalidRequest(f"{where}.{name} is required text", hint='e.g. "file"')
        if item.get("checksum") is not None and not isinstance(item["checksum"], str):
            raise InvalidRequest(f"{where}.checksum must be text", hint='e.g. "sha256:..."')
        metadata = item.get("metadata") or {}
        if not isinstance(metadata, dict):
            raise InvalidRequest(f"{where}.metadata must be an object", hint="or leave it out")
        clean.append(
            {
                "type": item["type"],
                "uri": item["uri"],
                "checksum": item.get("checksum"),
                "metadata": metadata,
            }
        )
    encode_json(clean, what="artifact list")
    return clean


def check_routing(rules: Any) -> list[dict[str, Any]]:
    """Routing rules: follow-on jobs created when this job completes.

    Each is {"role", "summary"?, "priority"?, "context"?, "constraints"?, "condition"?}.
    """
    if rules is None:
        return []
    if not isinstance(rules, list) or len(rules) > MAX_RULES:
        raise InvalidRequest(
            f"routing must be a list of at most {MAX_RULES} rules",
            hint='e.g. [{"role": "reviewer", "summary": "review the change"}]',
        )
    clean = []
    for i, rule in enumerate(rules):
        where = f"routing[{i}]"
        if not isinstance(rule, dict) or not isinstance(rule.get("role"), str):
            raise InvalidRequest(f"{where} needs a role", hint='e.g. {"role": "reviewer"}')
        unknown = set(rule) - {"role", "summary", "priority", "context", "constraints", "condition"}
        if unknown:
            raise InvalidRequest(
                f"{where} has unknown field(s) {', '.join(sorted(unknown))}",
                hint="a rule has role, summary, priority, context, constraints and condition",
            )
        out: dict[str, Any] = {"role": rule["role"]}
        if rule.get("summary") is not None:
            out["summary"] = check_summary(rule["summary"])
        if rule.get("priority") is not None:
            out["priority"] = check_priority(rule["priority"])
        if rule.get("context") is not None:
            out["context"] = check_context(rule["context"])
        if rule.get("constraints") is not None:
            out["constraints"] = check_constraints(rule["constraints"])
        if rule.get("condition") is not None:
            check_condition(rule["condition"], where=f"{where}.condition")
            out["condition"] = rule["condition"]
        clean.append(out)
    # Kept with the job and copied to each follow-on: bounded as a context is.
    encode_json(clean, what="routing")
    return clean


# -- the condition language ------------------------------------------------------------------
#
# A condition is data, never code: {"path": "data.verdict", "equals": "approve"}, or
# {"all": [...]}, {"any": [...]}, {"not": {...}}. Paths are dotted keys (numbers index
# lists) into the result {"summary", "data", "artifacts"}.

_MISSING = object()
# A list index in a path: ASCII digits only (str.isdigit takes "²", which int() refuses), and
# not so long that int() refuses it either.
_INDEX = re.compile(r"-?[0-9]{1,18}")


def check_condition(cond: Any, *, where: str = "condition", depth: int = 0) -> None:
    hint = 'e.g. {"path": "data.verdict", "equals": "approve"}, or all/any/not of conditions'
    if depth > MAX_CONDITION_DEPTH:
        raise InvalidRequest(f"{where} is nested too deeply", hint="flatten it with all/any")
    if not isinstance(cond, dict):
        raise InvalidRequest(f"{where} must be an object", hint=hint)
    if len(cond) == 1 and ("all" in cond or "any" in cond):
        items = cond.get("all", cond.get("any"))
        if not isinstance(items, list) or not items:
            raise InvalidRequest(f"{where}: all/any take a non-empty list", hint=hint)
        for i, item in enumerate(items):
            check_condition(item, where=f"{where}[{i}]", depth=depth + 1)
        return
    if len(cond) == 1 and "not" in cond:
        check_condition(cond["not"], where=f"{where}.not", depth=depth + 1)
        return
    ops = [k for k in cond if k != "path"]
    if not isinstance(cond.get("path"), str) or not cond["path"] or len(ops) != 1:
        raise InvalidRequest(f"{where} needs a path and exactly one operator", hint=hint)
    op = ops[0]
    if op not in CONDITION_OPS:
        raise InvalidRequest(
            f"{where}: unknown operator '{op}'", hint=f"one of {', '.join(CONDITION_OPS)}"
        )
    value = cond[op]
    if op == "in" and not isinstance(value, list):
        raise InvalidRequest(f"{where}: 'in' takes a list", hint='e.g. {"in": ["a", "b"]}')
    if op == "exists" and not isinstance(value, bool):
        raise InvalidRequest(f"{where}: 'exists' takes true or false", hint=hint)
    if op in ("gt", "gte", "lt", "lte") and not _is_number(value):
        raise InvalidRequest(f"{where}: '{op}' takes a number", hint=hint)


def evaluate(cond: dict[str, Any] | None, result: dict[str, Any]) -> bool:
    """Whether a (validated) condition holds for a job's result; no condition always holds.
    Total: whatever JSON the condition compares and the result holds, it answers, never
    raises (a raise would fail every completion of the job, and every bridge pass)."""
    if cond is None:
        return True
    if "all" in cond:
        return all(evaluate(c, result) for c in cond["all"])
    if "any" in cond:
        return any(evaluate(c, result) for c in cond["any"])
    if "not" in cond:
        return not evaluate(cond["not"], result)
    value = _resolve(result, cond["path"])
    op = next(k for k in cond if k != "path")
    expected = cond[op]
    if op == "exists":
        return bool((value is not _MISSING) == expected)
    if value is _MISSING:
        return op == "not_equals"
    if op == "equals":
        return bool(value == expected)
    if op == "not_equals":
        return bool(value != expected)
    if op == "in":
        return value in expected
    if op == "contains":
        if isinstance(value, list):
            return expected in value  # by equality: any JSON value may be an item
        # A text holds only text, and an object's keys are text: nothing else is in them.
        return isinstance(value, str | dict) and isinstance(expected, str) and expected in value
    if not _is_number(value):
        return False
    return bool(
        {
            "gt": value > expected,
            "gte": value >= expected,
            "lt": value < expected,
            "lte": value <= expected,
        }[op]
    )


def _is_number(value: Any) -> bool:
    if isinstance(value, bool):
        return False
    # An int is finite whatever its size (math.isfinite would convert it to a float, and
    # one of 400 digits overflows).
    return isinstance(value, int) or (isinstance(value, float) and math.isfinite(value))


def _resolve(value: Any, path: str) -> Any:
    for part in path.split("."):
        if isinstance(value, dict) and part in value:
            value = value[part]
        elif (
            isinstance(value, list)
            and _INDEX.fullmatch(part)
            and -len(value) <= int(part) < len(value)
        ):
            value = value[int(part)]
        else:
            return _MISSING
    return value


def job_artifacts(text: str | None) -> list[dict[str, Any]]:
    """A job's stored artifacts; an item that is not one (a row floom did not write) is
    shown as an artifact of type `floom_unreadable` saying why."""
    shown = []
    for item in jsonvalues.stored_list(text, items=dict):
        if isinstance(item.get("type"), str) and isinstance(item.get("uri"), str):
            shown.append(item)
        else:
            why = item.get(jsonvalues.UNREADABLE) or "an artifact without a type and a uri"
            shown.append({"type": jsonvalues.UNREADABLE, "uri": str(why)})
    return shown
