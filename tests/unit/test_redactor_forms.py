"""The redactor masks a secret in the forms it is commonly written in, not only as it is."""

from __future__ import annotations

import json
from urllib.parse import quote, quote_plus

from floom.services.access.secrets import REDACTED, Redactor


def test_a_secret_escaped_in_json_or_percent_encoded_is_masked() -> None:
    secret = 'a"b\\c-é/ x'
    redactor = Redactor([secret])
    for written in (
        json.dumps({"k": secret}),
        json.dumps({"k": secret}, ensure_ascii=False),
        json.dumps({"k": secret}).replace("/", "\\/"),
    ):
        assert redactor.text(written) == '{"k": "***"}', written
    assert redactor.text(f"https://u:{quote(secret, safe='')}@h/") == "https://u:***@h/"
    assert redactor.text(f"/p/{quote(secret)}?") == "/p/***?"
    assert redactor.text(f"q={quote_plus(secret)}&") == "q=***&"


def test_each_long_line_of_a_multi_line_secret_is_masked_alone_and_short_ones_are_not() -> None:
    secret = "-----BEGIN KEY-----\r\nMIIBOgIBAAJBAKj34GkxFhD90vcN\nend\n-----END KEY-----"
    redactor = Redactor([secret])
    assert redactor.text("MIIBOgIBAAJBAKj34GkxFhD90vcN") == REDACTED
    assert redactor.text("line: -----END KEY-----") == f"line: {REDACTED}"
    assert redactor.text("the end") == "the end"
    assert redactor.text(secret) == REDACTED


def test_a_plain_secret_is_masked_as_before_and_nothing_else_is() -> None:
    redactor = Redactor(["tok123456"])
    assert redactor.values == ("tok123456",)
    assert redactor.text("x tok123456 y") == f"x {REDACTED} y"
