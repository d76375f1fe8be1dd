from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from floom.errors import InputInvalid, ManifestInvalid
from floom.hints.cli import written
from floom.manifest.load import check_folder, check_manifest, load_folder, parse_manifest
from floom.manifest.schema import (
    ENTRY_CANDIDATES,
    FieldSpec,
    Manifest,
    Problem,
    format_problems,
    manifest_json_schema,
)

GOOD = """
name: daily-digest
title: Daily digest
description: Summarises the news.
inputs:
  topic: {type: string, required: true, description: what to read about}
  count: {type: integer, default: 5}
  ratio: number
  verbose: boolean
  level: {type: string, enum: [low, high], default: low}
  options: object
  tags: array
  attachment: file
outputs:
  summary: {type: string, required: true}
  score: number
secrets: [OPENAI_API_KEY]
network: full
limits: {timeout_seconds: 120, memory_mb: 256, max_total_tokens: 10000, monthly_cost_usd: 2.5}
retries: {count: 3, backoff_seconds: 1.5, backoff: fixed}
concurrency: 2
triggers:
  - schedule: {cron: "0 9 * * *", timezone: Europe/Paris, inputs: {topic: news}}
  - webhook: {secret: HOOK_SECRET, inputs: {topic: topic}}
tools:
  - builtin: web_fetch
  - mcp: {url: "http://localhost:9000/mcp"}
calls: [summarise-page]
approvals: {required: true}
model: claude-sonnet
expose: [mcp, rest]
"""


def problems_of(text: str, files: list[str] | None = None) -> dict[str, Problem]:
    manifest, problems = check_manifest(text, ["run.py"] if files is None else files)
    assert manifest is None
    return {problem.path: problem for problem in problems}


def manifest_with(extra: str, files: list[str] | None = None) -> Manifest:
    return parse_manifest("name: w\n" + extra, ["run.py"] if files is None else files)


def test_a_complete_manifest_parses_and_survives_a_json_round_trip() -> None:
    manifest = parse_manifest(GOOD, ["run.py", "lib/helpers.py"])

    assert manifest.name == "daily-digest"
    assert manifest.entry == "run.py"
    assert manifest.kind == "script"
    assert manifest.command() == ["python3", "run.py"]
    assert manifest.inputs["ratio"] == FieldSpec(type="number")
    assert manifest.inputs["count"].default == 5
    assert manifest.limits.timeout_seconds == 120
    assert manifest.limits.monthly_cost_usd == 2.5
    assert manifest.retries.backoff == "fixed"
    assert manifest.triggers == [
        {
            "schedule": {
                "cron": "0 9 * * *",
                "timezone": "Europe/Paris",
                "inputs": {"topic": "news"},
            }
        },
        {"webhook": {"secret": "HOOK_SECRET", "inputs": {"topic": "topic"}}},
    ]
    assert manifest.tools[1] == {"mcp": {"url": "http://localhost:9000/mcp"}}
    assert manifest.approvals == {"required": True}
    assert Manifest.model_validate(json.loads(manifest.model_dump_json())) == manifest


def test_a_minimal_manifest_gets_the_documented_defaults() -> None:
    manifest = manifest_with("")

    assert manifest.title == "w"
    assert manifest.description == ""
    assert manifest.network == "none"
    assert manifest.limits.timeout_seconds == 600
    assert manifest.limits.memory_mb == 512
    assert manifest.retries.count == 0
    assert manifest.retries.backoff_seconds == 5
    assert manifest.retries.backoff == "exponential"
    assert manifest.concurrency is None
    assert manifest.inputs == {}
    assert manifest.secrets == []
    assert manifest.expose == []


def test_the_manifest_is_immutable() -> None:
    manifest = manifest_with("")

    with pytest.raises(ValueError, match="frozen"):
        manifest.name = "other"  # type: ignore[misc]


def test_the_entry_is_detected_when_exactly_one_candidate_exists() -> None:
    assert manifest_with("", ["run.sh", "data.csv"]).command() == ["bash", "run.sh"]
    assert manifest_with("", ["run.js"]).command() == ["node", "run.js"]
    agent = manifest_with("", ["SKILL.md", "notes/run.py"])
    assert agent.entry == "SKILL.md"
    assert agent.kind == "agent"


def test_a_folder_without_an_entry_file_is_a_problem_listing_the_options() -> None:
    problem = problems_of("name: w\n", ["README.md"])["entry"]

    assert problem.message == "no entry file"
    assert problem.hint is not None
    assert all(candidate in written(problem.hint or "") for candidate in ENTRY_CANDIDATES)


def test_two_entry_candidates_are_a_problem_asking_for_entry() -> None:
    problem = problems_of("name: w\n", ["run.py", "SKILL.md"])["entry"]

    assert "run.py" in problem.message
    assert "SKILL.md" in problem.message
    assert problem.hint == "set entry: in worker.yml"


def test_an_explicit_entry_resolves_two_candidates_and_may_sit_in_a_subfolder() -> None:
    assert manifest_with("entry: run.py\n", ["run.py", "SKILL.md"]).entry == "run.py"
    assert manifest_with("entry: ./src/main.py\n", ["src/main.py"]).command() == [
        "python3",
        "src/main.py",
    ]
    assert manifest_with("entry: agent/SKILL.md\n", ["agent/SKILL.md"]).kind == "agent"


@pytest.mark.parametrize(
    ("entry", "words"),
    [
        ("main.rb", "not a .py, .sh, .js or .ts script"),
        ("../run.py", "relative path inside"),
        ("/etc/run.py", "relative path inside"),
        ("missing.py", "not in the folder"),
    ],
)
def test_an_explicit_entry_must_be_a_runnable_file_inside_the_folder(
    entry: str, words: str
) -> None:
    problem = problems_of(f"name: w\nentry: {entry}\n", ["run.py", "main.rb"])["entry"]

    assert words in problem.message


def test_a_typescript_entry_needs_a_runner_on_path(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(shutil, "which", lambda name: None)
    problem = problems_of("name: w\n", ["run.ts"])["entry"]
    assert all(runner in problem.message for runner in ("tsx", "ts-node", "deno", "bun"))

    monkeypatch.setattr(shutil, "which", lambda name: "/usr/bin/deno" if name == "deno" else None)
    assert manifest_with("", ["run.ts"]).command() == ["deno", "run", "-A", "run.ts"]

    monkeypatch.setattr(shutil, "which", lambda name: "/usr/bin/tsx" if name == "tsx" else None)
    assert manifest_with("", ["run.ts"]).command() == ["tsx", "run.ts"]


def test_every_problem_is_collected_at_once_with_its_path() -> None:
    text = """
name: Bad Name
entry: nowhere.py
inputs:
  count: {type: integer, default: many}
limits: {timeout_seconds: 0, memory_mb: 100000}
retries: {count: 2, backoff: linear}
network: some
concurrency: 0
triggers:
  - schedule: every day
"""
    problems = problems_of(text)

    assert set(problems) == {
        "name",
        "entry",
        "inputs.count.default",
        "limits.timeout_seconds",
        "limits.memory_mb",
        "retries.backoff",
        "network",
        "concurrency",
        "triggers[0].schedule",
    }
    assert problems["name"].hint is not None
    assert '"bad-name"' in written(problems["name"].hint or "")
    assert problems["limits.memory_mb"].message == "must be at most 65536, got 100000"


def test_parse_manifest_raises_one_error_carrying_every_problem() -> None:
    with pytest.raises(ManifestInvalid) as caught:
        parse_manifest("name: w\nnetwork: some\nconcurrency: 0\nlimits: {memory_mb: 1}\n", [])

    error = caught.value
    assert error.message.startswith("worker.yml has 4 problems")
    assert error.code == "manifest_invalid"
    assert {d["path"] for d in error.details} == {
        "entry",
        "network",
        "concurrency",
        "limits.memory_mb",
    }


def test_a_missing_name_is_a_problem() -> None:
    assert problems_of("description: x\n")["name"].message == "required"


def test_unknown_keys_get_a_did_you_mean_hint_at_every_level() -> None:
    text = """
name: w
titel: x
limits: {timeout_secs: 5}
retries: {cuont: 1}
inputs:
  topic: {type: string, requird: true}
approvals: {requires: true}
"""
    problems = problems_of(text)

    assert problems["titel"].message == "unknown key 'titel'"
    assert problems["titel"].hint == "did you mean 'title'?"
    assert problems["limits.timeout_secs"].hint == "did you mean 'timeout_seconds'?"
    assert problems["retries.cuont"].hint == "did you mean 'count'?"
    assert problems["inputs.topic.requird"].hint == "did you mean 'required'?"
    assert problems["approvals.requires"].hint == "did you mean 'required'?"


def test_an_unknown_key_with_no_close_match_lists_the_allowed_keys() -> None:
    hint = problems_of("name: w\nzzz: 1\n")["zzz"].hint

    assert hint is not None
    assert written(hint).startswith("allowed keys: name, title")


def test_unknown_type_names_get_a_did_you_mean_hint() -> None:
    problems = problems_of("name: w\ninputs: {a: strng, b: {type: int}, c: {type: float}}\n")

    assert problems["inputs.a.type"].message == "unknown type 'strng'"
    assert problems["inputs.a.type"].hint == "did you mean 'string'?"
    assert problems["inputs.b.type"].hint == "did you mean 'integer'?"
    assert problems["inputs.c.type"].hint == "did you mean 'number'?"


def test_a_field_cannot_be_both_required_and_defaulted() -> None:
    problem = problems_of("name: w\ninputs: {n: {type: integer, required: true, default: 1}}\n")[
        "inputs.n"
    ]

    assert "required" in problem.message
    assert "default" in problem.message


def test_a_default_must_be_one_of_the_enum_values() -> None:
    problems = problems_of("name: w\ninputs: {lvl: {enum: [low, high], default: mid}}\n")

    assert problems["inputs.lvl.default"].message == "'mid' is not in enum"


def test_enum_values_and_defaults_must_match_the_field_type() -> None:
    text = "name: w\ninputs: {n: {type: integer, enum: [1, two]}, f: {type: boolean, default: 1}}\n"
    problems = problems_of(text)

    assert problems["inputs.n.enum[1]"].message == "expected integer, got 'two'"
    assert problems["inputs.f.default"].message == "expected boolean, got 1"


def test_field_names_must_be_identifiers() -> None:
    problems = problems_of("name: w\noutputs: {my-field: string}\n")

    assert "not a valid field name" in problems["outputs.my-field"].message


def test_secrets_must_be_unique_upper_case_names() -> None:
    problems = problems_of("name: w\nsecrets: [API_KEY, openai-key, API_KEY, FLOOM_TOKEN]\n")

    assert problems["secrets[1]"].hint is not None
    assert '"OPENAI_KEY"' in written(problems["secrets[1]"].hint or "")
    assert "twice" in problems["secrets[2]"].message
    assert "floom sets FLOOM_* variables" in problems["secrets[3]"].message
    assert manifest_with("secrets: [API_KEY, _PRIVATE2]\n").secrets == ["API_KEY", "_PRIVATE2"]


@pytest.mark.parametrize(
    ("name", "why"),
    [
        ("LD_PRELOAD", "dynamic loader"),
        ("LD_LIBRARY_PATH", "dynamic loader"),
        ("GCONV_PATH", "C library"),
        ("GLIBC_TUNABLES", "C library"),
        ("MALLOC_TRACE", "allocator"),
        ("BASH_ENV", "shells"),
        ("ENV", "shells"),
        ("IFS", "shells"),
        ("PATH", "floom sets it"),
        ("HOME", "floom sets it"),
        ("PYTHONPATH", "Python"),
        ("PYTHONSTARTUP", "Python"),
        ("NODE_OPTIONS", "Node.js"),
        ("PERL5OPT", "Perl"),
        ("RUBYOPT", "Ruby"),
        ("JAVA_TOOL_OPTIONS", "Java"),
        ("FLOOM_SANDBOX_FOR", "FLOOM_*"),
    ],
)
def test_a_secret_name_that_changes_how_programs_load_or_run_is_refused_saying_why(
    name: str, why: str
) -> None:
    for key in ("secrets", "apply_secrets"):
        extra = "approvals: {required: true}\n" if key == "apply_secrets" else ""
        problems = problems_of(f"name: w\n{extra}{key}: [API_KEY, {name}]\n")

        assert list(problems) == [f"{key}[1]"], problems
        assert why in problems[f"{key}[1]"].message
        assert "LD_*" in written(problems[f"{key}[1]"].hint or "")


def test_names_beside_the_refused_ones_stay_allowed() -> None:
    allowed = ["NODE_ENV", "OPENAI_API_KEY", "LDAP_PASSWORD", "PATHWAY_TOKEN", "HOMEPAGE_KEY"]
    assert manifest_with(f"secrets: [{', '.join(allowed)}]\n").secrets == allowed


def test_retries_may_be_a_bare_count() -> None:
    retries = manifest_with("retries: 2\n").retries

    assert retries.count == 2
    assert retries.backoff == "exponential"
    assert problems_of("name: w\nretries: 21\n")["retries.count"].message.startswith(
        "must be at most 20"
    )
    assert "retries" in problems_of("name: w\nretries: true\n")


def test_limits_accept_the_agent_budgets_as_positive_numbers() -> None:
    limits = manifest_with("limits: {max_tool_iterations: 20, monthly_cost_usd: 3}\n").limits
    problems = problems_of("name: w\nlimits: {max_total_tokens: 0, monthly_cost_usd: -1}\n")

    assert limits.max_tool_iterations == 20
    assert limits.monthly_cost_usd == 3
    assert set(problems) == {"limits.max_total_tokens", "limits.monthly_cost_usd"}


def test_triggers_must_be_single_key_mappings_of_a_known_kind() -> None:
    text = """
name: w
triggers:
  - schedule: {cron: "* * * * *"}
  - schedul: {cron: "* * * * *"}
  - schedule: {}
    timezone: UTC
  - webhook: yes
  - cron
"""
    problems = problems_of(text)

    assert problems["triggers[1].schedul"].hint == "did you mean 'schedule'?"
    assert "one key" in problems["triggers[2]"].message
    assert "mapping" in problems["triggers[3].webhook"].message
    assert "triggers[4]" in problems
    assert "triggers[0]" not in problems


def test_tools_must_name_exactly_one_source() -> None:
    text = """
name: w
tools:
  - builtin: web_fetch
  - bultin: web_fetch
  - {builtin: a, composio: b}
  - web_fetch
"""
    problems = problems_of(text)

    assert problems["tools[1]"].hint == "did you mean 'builtin'?"
    assert "builtin and composio" in problems["tools[2]"].message
    assert "tools[3]" in problems
    assert "tools[0]" not in problems


def test_an_empty_expose_is_refused_rather_than_read_as_no_surface_or_every_one() -> None:
    problem = problems_of("name: w\nexpose: []\n")["expose"]
    assert problem.message == "lists no surface"
    assert "leave `expose` out" in written(problem.hint or "")


def test_calls_and_expose_are_checked_for_shape() -> None:
    problems = problems_of("name: w\ncalls: [Other_Worker]\nexpose: [mcp, rset]\n")

    assert "calls[0]" in problems
    assert problems["expose[1]"].hint == "did you mean 'rest'?"


def test_a_yaml_syntax_error_is_one_problem_with_its_line() -> None:
    manifest, problems = check_manifest("name: w\ninputs:\n  a: string\n   b: [\n", ["run.py"])

    assert manifest is None
    assert len(problems) == 1
    assert problems[0].path == ""
    assert "line 4" in problems[0].message


def test_a_duplicate_key_is_a_yaml_problem_with_its_line() -> None:
    problems = list(problems_of("name: w\nnetwork: none\nnetwork: full\n").values())

    assert len(problems) == 1
    assert "duplicate key 'network'" in problems[0].message
    assert "line 3" in problems[0].message


@pytest.mark.parametrize("text", ["", "- name: w\n", "just text\n"])
def test_the_document_must_be_a_mapping(text: str) -> None:
    problems = problems_of(text)

    assert list(problems) == [""]


def test_inputs_are_coerced_from_command_line_text_by_type() -> None:
    manifest = parse_manifest(GOOD, ["run.py"])

    clean = manifest.coerce_inputs(
        {
            "topic": "rust",
            "count": "42",
            "ratio": "1.5",
            "verbose": "yes",
            "level": "high",
            "options": '{"a": 1}',
            "tags": '["x", "y"]',
            "attachment": "artifact:abc",
        },
        from_strings=True,
    )

    assert clean == {
        "topic": "rust",
        "count": 42,
        "ratio": 1.5,
        "verbose": True,
        "level": "high",
        "options": {"a": 1},
        "tags": ["x", "y"],
        "attachment": "artifact:abc",
    }


@pytest.mark.parametrize(
    ("text", "expected"),
    [("true", True), ("False", False), ("no", False), ("1", True), ("0", False)],
)
def test_boolean_inputs_accept_the_usual_words(text: str, expected: bool) -> None:
    manifest = manifest_with("inputs: {flag: boolean}\n")

    assert manifest.coerce_inputs({"flag": text}, from_strings=True) == {"flag": expected}


def test_defaults_are_filled_and_absent_optional_inputs_left_out() -> None:
    manifest = parse_manifest(GOOD, ["run.py"])

    assert manifest.coerce_inputs({"topic": "go"}) == {"topic": "go", "count": 5, "level": "low"}


@pytest.mark.parametrize(
    ("field", "text", "message"),
    [
        ("count", "abc", "input 'count': expected integer, got 'abc'"),
        ("count", "1.5", "input 'count': expected integer, got '1.5'"),
        ("ratio", "fast", "input 'ratio': expected number, got 'fast'"),
        ("verbose", "maybe", "input 'verbose': expected boolean"),
        ("options", "[1]", "input 'options': expected object, got [1]"),
        ("tags", "{oops", "input 'tags': expected array as JSON text"),
        ("level", "mid", "input 'level': expected one of 'low', 'high', got 'mid'"),
    ],
)
def test_a_bad_command_line_input_is_refused_naming_the_field(
    field: str, text: str, message: str
) -> None:
    manifest = parse_manifest(GOOD, ["run.py"])

    with pytest.raises(InputInvalid) as caught:
        manifest.coerce_inputs({"topic": "x", field: text}, from_strings=True)

    assert caught.value.message.startswith(message)
    assert [detail["path"] for detail in caught.value.details] == [f"inputs.{field}"]


def test_json_inputs_must_already_have_the_declared_type() -> None:
    manifest = parse_manifest(GOOD, ["run.py"])

    assert manifest.coerce_inputs({"topic": "x", "ratio": 2})["ratio"] == 2
    for field, value in [("count", "42"), ("count", True), ("ratio", False), ("tags", "[]")]:
        with pytest.raises(InputInvalid, match=f"input '{field}'"):
            manifest.coerce_inputs({"topic": "x", field: value})


def test_every_input_problem_is_reported_at_once() -> None:
    manifest = parse_manifest(GOOD, ["run.py"])

    with pytest.raises(InputInvalid) as caught:
        manifest.coerce_inputs({"count": "x", "verbose": "y"}, from_strings=True)

    paths = [detail["path"] for detail in caught.value.details]
    assert paths == ["inputs.topic", "inputs.count", "inputs.verbose"]
    assert "input 'topic': required but missing" in caught.value.message


def test_an_unknown_input_is_refused_with_a_did_you_mean_hint() -> None:
    manifest = parse_manifest(GOOD, ["run.py"])

    with pytest.raises(InputInvalid) as caught:
        manifest.coerce_inputs({"topic": "x", "cuont": 3})

    assert caught.value.message == "input 'cuont': not a declared input"
    assert caught.value.hint == "did you mean 'count'?"


def test_a_worker_without_inputs_refuses_any_input() -> None:
    with pytest.raises(InputInvalid) as caught:
        manifest_with("").coerce_inputs({"x": 1})

    assert caught.value.details[0]["path"] == "inputs.x"


def test_outputs_are_checked_for_presence_type_and_declaration() -> None:
    manifest = manifest_with(
        "outputs: {summary: {required: true}, score: number, grade: {enum: [a, b]}}\n"
    )

    assert manifest.check_outputs({"summary": "ok", "score": 3, "grade": "a"}) == []
    problems = manifest.check_outputs({"score": "high", "grade": "c", "extra": 1, "sumary": "x"})
    by_path = {problem.path: problem for problem in problems}
    assert by_path["outputs.summary"].message == "required output missing"
    assert by_path["outputs.score"].message == "expected number, got 'high'"
    assert "outputs.grade" in by_path
    assert by_path["outputs.extra"].message == "undeclared output"
    assert by_path["outputs.sumary"].hint == "did you mean 'summary'?"


def test_a_worker_without_declared_outputs_accepts_any_outputs() -> None:
    assert manifest_with("").check_outputs({"anything": [1, 2], "else": None}) == []


def test_format_problems_renders_one_line_per_problem() -> None:
    text = format_problems(
        [
            Problem("inputs.a.type", "unknown type 'strng'", "did you mean 'string'?"),
            Problem("", "x"),
        ]
    )

    assert text == ("  inputs.a.type: unknown type 'strng' (hint: did you mean 'string'?)\n  x")


def test_a_folder_loads_with_its_files_listed_recursively(tmp_path: Path) -> None:
    (tmp_path / "worker.yml").write_text("name: w\nentry: src/main.py\n")
    (tmp_path / "src").mkdir()
    (tmp_path / "src" / "main.py").write_text("print(1)\n")
    (tmp_path / "node_modules").mkdir()
    (tmp_path / "node_modules" / "run.js").write_text("")

    assert load_folder(tmp_path).entry == "src/main.py"


def test_skipped_folders_do_not_count_as_entry_candidates(tmp_path: Path) -> None:
    (tmp_path / "worker.yml").write_text("name: w\n")
    (tmp_path / "run.py").write_text("")
    (tmp_path / ".venv").mkdir()
    (tmp_path / ".venv" / "run.sh").write_text("")

    assert load_folder(tmp_path).entry == "run.py"


def test_a_folder_without_worker_yml_is_a_problem_with_a_hint(tmp_path: Path) -> None:
    (tmp_path / "run.py").write_text("")

    manifest, problems = check_folder(tmp_path)

    assert manifest is None
    assert problems[0].hint == "create worker.yml with at least name:"
    with pytest.raises(ManifestInvalid):
        load_folder(tmp_path)


def test_the_json_schema_describes_worker_yml() -> None:
    schema = manifest_json_schema()

    assert isinstance(schema, dict)
    assert "name" in schema["properties"]
    assert schema["required"] == ["name"]
    json.dumps(schema)


def test_a_handoff_trigger_without_a_role_is_refused_with_its_path() -> None:
    _, problems = check_manifest(
        "name: rev\ntriggers:\n  - handoff: {}\n  - handoff: {role: reviewer, colour: red}\n",
        ["run.py"],
    )
    paths = {p.path for p in problems}
    assert "triggers[0].handoff.role" in paths
    assert "triggers[1].handoff.colour" in paths


@pytest.mark.parametrize(
    ("text", "path", "example"),
    [
        ("name: yes\n", "name", 'name: "yes"'),
        ("name: m\ntitle: on\n", "title", 'title: "yes"'),
        ("name: m\ndescription: 1.10\n", "description", 'description: "1.1"'),
        ("name: m\nsecrets: [ON]\n", "secrets[0]", '["YES"]'),
    ],
)
def test_text_yaml_read_as_a_boolean_or_number_is_refused_with_a_hint_to_quote_it(
    text: str, path: str, example: str
) -> None:
    hint = str(problems_of(text)[path].hint)
    assert "quote the text as you wrote it" in hint
    assert hint.endswith(example)


def test_a_name_that_quoting_would_not_mend_gets_the_names_own_hint() -> None:
    hint = str(problems_of("name: 2024\n")["name"].hint)
    assert "use lowercase letters" in hint
    assert "quote" not in hint
