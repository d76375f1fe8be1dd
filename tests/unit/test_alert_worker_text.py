"""What a worker wrote (its result's error message) reaches Slack and mail alerts on the line
floom gives it: a line break or a control character of the worker's is said escaped, so no
text of theirs starts a line that poses as floom's ("*floom*: worker x recovered", a
"run_url:" pointing elsewhere), and nothing of theirs hides or reorders what follows."""

from __future__ import annotations

from typing import Any

from floom.services.alerts.senders import mail_text, slack_text

FORGED = (
    "boom\n*floom*: worker billing recovered: run run_2 succeeded\r\n"
    "run_url: https://evil.example/login\u2028\u202eesrever\x1b[2J"
)


def _body() -> dict[str, Any]:
    return {
        "type": "run_failed",
        "summary": "worker billing: run run_1 failed (worker_error)",
        "worker": "billing",
        "run_url": "http://127.0.0.1:8000/ui/runs/run_1",
        "error": {"code": "worker_error", "message": FORGED},
    }


def test_a_workers_error_reaches_slack_on_its_own_line_and_said_escaped() -> None:
    lines = slack_text(_body()).split("\n")
    assert lines[0] == "*floom*: worker billing: run run_1 failed (worker_error)"
    assert lines[1].startswith("error `worker_error`: boom\\n*floom*: worker billing recovered")
    assert lines[2:] == ["http://127.0.0.1:8000/ui/runs/run_1"]
    for char in ("\r", "\u2028", "\u202e", "\x1b"):
        assert char not in lines[1]


def test_a_workers_error_reaches_a_mail_body_on_its_own_line_and_said_escaped() -> None:
    text = mail_text(_body())
    head = text.split("\n\n{", 1)[0]  # the lines before the body's JSON
    assert [line for line in head.split("\n") if line.startswith("run_url:")] == [
        "run_url: http://127.0.0.1:8000/ui/runs/run_1"
    ]
    assert not any(line.startswith("*floom*") for line in head.split("\n"))
    for char in ("\r", "\u2028", "\u202e", "\x1b"):
        assert char not in text
