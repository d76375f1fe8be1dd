"""The agent sections of worker.yml are checked in depth for SKILL.md workers."""

from __future__ import annotations

from floom.manifest.agent import tool_specs
from floom.manifest.load import check_manifest, parse_manifest
from floom.manifest.schema import Problem


def problems_of(text: str, files: list[str] | None = None) -> dict[str, Problem]:
    manifest, problems = check_manifest(text, files or ["SKILL.md"])
    assert manifest is None
    return {problem.path: problem for problem in problems}


def test_a_complete_agent_manifest_parses_into_tool_specs() -> None:
    manifest = parse_manifest(
        """\
name: triage
model: claude-haiku-4-5
secrets: [GITHUB_TOKEN]
apply_secrets: [SLACK_TOKEN]
approvals: {required: true}
calls: [hello]
tools:
  - builtin: http_request
    allow_domains: [api.github.com, "*.slack.com"]
    methods: [GET]
  - builtin: http_request
    name: github_write
    allow_domains: [api.github.com]
    approval: always
  - mcp: {name: linear, url: "https://mcp.linear.app/mcp", auth_secret: LINEAR_TOKEN,
          allowed_tools: [list_issues]}
  - composio: {app: gmail, allowed_tools: [GMAIL_SEND_EMAIL], approval: always}
""",
        ["SKILL.md"],
    )

    specs = tool_specs(manifest)
    assert [(s.source, s.name, s.gated) for s in specs] == [
        ("builtin", "http_request", False),
        ("builtin", "github_write", True),
        ("mcp", "linear", False),
        ("composio", "gmail", True),
    ]
    assert specs[0].options == {
        "allow_domains": ["api.github.com", "*.slack.com"],
        "methods": ["GET"],
    }
    assert manifest.apply_secrets == ["SLACK_TOKEN"]
    assert manifest.model == "claude-haiku-4-5"


def test_each_agent_tool_problem_is_reported_with_its_path_and_a_hint() -> None:
    problems = problems_of("""\
name: bad
calls: [bad]
tools:
  - builtin: web_fetch
  - builtin: http_request
  - builtin: http_request
    allow_domains: ["https://x.com/"]
    methods: [FETCH]
    approval: sometimes
  - builtin: read_file
    aproval: always
  - mcp: {name: Linear, command: "npx linear-mcp"}
  - composio: {allowed_tools: []}
""")

    assert "unknown built-in tool 'web_fetch'" in problems["tools[0].builtin"].message
    assert "domains it may reach" in problems["tools[1].allow_domains"].message
    assert "also used by tools[1]" in problems["tools[2]"].message
    assert "not a domain" in problems["tools[2].allow_domains[0]"].message
    assert "FETCH" in problems["tools[2].methods[0]"].message
    assert "always or never" in problems["tools[2].approval"].message
    assert problems["tools[3].aproval"].hint == "did you mean 'approval'?"
    assert "short name" in problems["tools[4].mcp.name"].message
    assert "outside the sandbox" in str(problems["tools[4].mcp.command"].hint)
    assert "Streamable HTTP URL" in problems["tools[4].mcp.url"].message
    assert "allowed_tools" in problems["tools[4].mcp.allowed_tools"].path
    assert "tools[5].composio.app" in problems
    assert "cannot call itself" in problems["calls"].message


def test_apply_secrets_need_the_run_level_gate_and_differ_from_secrets() -> None:
    manifest, problems = check_manifest(
        "name: w\nsecrets: [A_TOKEN]\napply_secrets: [A_TOKEN]\n", ["run.py"]
    )

    assert manifest is None
    messages = {p.message: p.hint for p in problems if p.path == "apply_secrets"}
    gate = next(m for m in messages if "apply phase" in m)
    assert "approvals: {required: true}" in str(messages[gate])
    assert "A_TOKEN is in both secrets and apply_secrets" in messages


def test_a_script_workers_tools_keep_the_plain_shape_check() -> None:
    manifest = parse_manifest("name: w\ntools: [{builtin: web_fetch}]\n", ["run.py"])

    assert manifest.tools == [{"builtin": "web_fetch"}]


def test_an_mcp_auth_secret_under_a_refused_name_is_a_problem_saying_why() -> None:
    problems = problems_of(
        "name: w\ntools:\n"
        '  - mcp: {name: linear, url: "https://mcp.linear.app/mcp", auth_secret: LD_PRELOAD}\n'
    )

    assert "dynamic loader" in problems["tools[0].mcp.auth_secret"].message
