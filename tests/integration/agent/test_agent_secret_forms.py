"""A declared secret is masked in the forms a program or floom itself commonly writes it:
as it is, escaped inside a JSON string, percent-encoded in a URL, and line by line when the
value spans lines; in the run's log, in what the model is sent, and in the tool-call records
(the in-memory sandbox and the fake model provider, as in
tests/integration/agent/test_agent_loop_fake.py)."""

from __future__ import annotations

import json
from urllib.parse import quote, quote_plus

from floom.sandbox.fake import FakeProcess
from floom.services.access import secrets
from floom.services.access.principal import SYSTEM
from floom.services.runs import agent as agent_runs
from floom.services.runs.logs import list_events
from tests.integration.agent.test_agent_loop_fake import Rig, rig  # noqa: F401  (rig is a fixture)
from tests.support.rigs.fake_provider import call, finish

# A password with the characters JSON and URLs escape, and a key of several lines.
PASSWORD = 'p@ss "wörd"\\ 42/x'
PEM = (
    "-----BEGIN TEST KEY-----\n"
    "MIIBOgIBAAJBAKj34GkxFhD90vcNLYLInFEX6Ppy1tPf9Cnzj4p4WGeKLs1Pt8Qu\n"
    "KUpRKfFLfRYC9AIKjbJTWit+CqvjWYzvQwECAwEAAQJAIJLixBy2qpFoS4DSmoEm\n"
    "-----END TEST KEY-----"
)
WORKER = """\
name: leaky
secrets: [DB_PASSWORD, SIGNING_KEY]
tools: [{builtin: run_command}, {builtin: write_file}]
"""


def _forms() -> list[str]:
    return [
        PASSWORD,
        json.dumps(PASSWORD)[1:-1],
        json.dumps(PASSWORD, ensure_ascii=False)[1:-1],
        quote(PASSWORD, safe=""),
        quote_plus(PASSWORD),
        *PEM.split("\n")[1:3],
        json.dumps(PEM)[1:-1],
    ]


def test_a_secret_in_its_common_forms_reaches_neither_log_nor_model_nor_records(
    rig: Rig,  # noqa: F811
) -> None:
    secrets.set_secret(rig.ctx, name="DB_PASSWORD", value=PASSWORD, caller=SYSTEM)
    secrets.set_secret(rig.ctx, name="SIGNING_KEY", value=PEM, caller=SYSTEM)

    def echo(p: FakeProcess) -> int:
        password, key = p.env["DB_PASSWORD"], p.env["SIGNING_KEY"]
        p.print(json.dumps({"password": password}))
        p.print(f"postgresql://app:{quote(password, safe='')}@db/app")
        p.print(f"form: pw={quote_plus(password)}")
        for line in key.split("\n"):
            p.print(line)
        p.print(json.dumps({"key": key}))
        return 0

    rig.sandbox.programs["leaky"] = echo
    rig.deploy(WORKER)
    rig.model.script(
        call("run_command", {"command": "show"}),
        call("write_file", {"path": "note.txt", "content": json.dumps({"k": PEM})}),
        finish({}),
    )
    run = rig.run("leaky")

    assert run.status == "succeeded", run.error_message
    lines = "\n".join(e.line for e in list_events(rig.ctx, caller=SYSTEM, run_id=run.id))
    sent = json.dumps([r.messages for r in rig.model.requests], ensure_ascii=False)
    records = json.dumps(
        [
            [c.arguments_json, c.result, c.error]
            for c in agent_runs.list_tool_calls(rig.ctx, caller=SYSTEM, run_id=run.id)
        ],
        ensure_ascii=False,
    )
    for form in _forms():
        assert form not in lines, form
        assert form not in sent, form
        assert form not in records, form
    assert "postgresql://app:***@db/app" in lines
