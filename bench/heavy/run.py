"""hello, after importing what a worker that talks to services loads: TLS and crypto, YAML,
JWT, HTTP, e-mail, XML, asyncio, sqlite3, decimal (the sandbox's own Python has these)."""

import asyncio
import decimal
import email.mime.multipart
import http.client
import json
import os
import sqlite3
import urllib.request
import xml.etree.ElementTree
from pathlib import Path

import cryptography.x509
import jwt
import pygments.lexers.python  # type: ignore[import-untyped]  # no types, nor stubs in [dev]
import yaml
from cryptography.hazmat.primitives import hashes

assert asyncio
assert decimal
assert email
assert http
assert sqlite3
assert urllib
assert xml
assert hashes
assert cryptography.x509
assert jwt
assert pygments
assert yaml

inputs = json.loads(Path("inputs.json").read_text())
greeting = " ".join([f"Hello, {inputs['name']}!"] * inputs["times"])
print(greeting)
out = Path(os.environ["FLOOM_OUTPUT_DIR"])
(out / "greeting.txt").write_text(greeting + "\n")
Path("result.json").write_text(
    json.dumps({"outputs": {"greeting": greeting, "length": len(greeting)}})
)
