"""FLOOM_S3_ENDPOINT is shown by floom doctor, errors and logs: it is refused at start when
it holds credentials (they belong in the key settings) or is not an http(s) URL of a host."""

from __future__ import annotations

import pytest
from pydantic import ValidationError

from floom.config import Settings


@pytest.mark.parametrize(
    ("endpoint", "said"),
    [
        ("http://AKIA:wJalrXUtn@127.0.0.1:8333", "holds credentials"),
        ("https://only-user@s3.example.test", "holds credentials"),
        ("127.0.0.1:8333", "http(s)://HOST[:PORT]"),
        ("ftp://127.0.0.1", "http(s)://HOST[:PORT]"),
        ("http://127.0.0.1:8333/?X-Amz-Credential=k", "query or fragment"),
    ],
)
def test_an_endpoint_with_credentials_or_not_a_host_url_is_refused_without_echoing_it(
    endpoint: str, said: str
) -> None:
    with pytest.raises(ValidationError) as refused:
        Settings(s3_endpoint=endpoint)
    message = refused.value.errors()[0]["msg"]
    assert said in message
    assert "wJalrXUtn" not in message


@pytest.mark.parametrize("endpoint", ["", "http://127.0.0.1:8333", "https://s3.example.test/x"])
def test_a_plain_endpoint_is_kept(endpoint: str) -> None:
    assert Settings(s3_endpoint=endpoint).s3_endpoint == endpoint
