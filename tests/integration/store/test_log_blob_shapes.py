"""A run's log blob that is not one floom wrote (a crafted row in a restored or copied store,
bytes written by hand): reading the log, or merging later lines into it, says which run and
blob and what was wrong, as BlobUnreadable, and never unpacks more than a log can hold."""

from __future__ import annotations

import gzip
import json

import pytest

from floom.errors import BlobUnreadable
from floom.services.access.principal import SYSTEM
from floom.services.context import Context
from floom.services.runs.logs import list_events
from floom.store.blobs.logs import MAX_LOG_BLOB_BYTES
from floom.store.blobs.rows import inline_blob, insert_blob
from floom.store.blobs.tables import RunLog
from floom.store.db import session_scope
from floom.store.models import Run, new_id
from floom.vocabulary import RunStatus

BOMB = gzip.compress(b"\n" * (MAX_LOG_BLOB_BYTES + 1), compresslevel=9)


@pytest.mark.parametrize(
    ("data", "said"),
    [
        (b"not gzip at all", "not gzip"),
        (gzip.compress(b"\xff\xfe\n"), "not UTF-8"),
        (gzip.compress(b"{not json\n"), "not JSON"),
        (gzip.compress(json.dumps([1, 2]).encode() + b"\n"), "not a log line"),
        (gzip.compress(b'[1, 1, "yesterday", "stdout", "x"]\n'), "not a log line"),
        (
            gzip.compress(b'{"agent": 1}\n[1, 1, "2026-01-01T00:00:00+00:00", 5, []]\n'),
            "not a log line",
        ),
        (BOMB, f"more than {MAX_LOG_BLOB_BYTES} bytes"),
    ],
    ids=["not-gzip", "not-utf8", "not-json", "short-line", "bad-time", "bad-types", "bomb"],
)
def test_a_log_blob_floom_did_not_write_is_unreadable_naming_the_run(
    ctx: Context, data: bytes, said: str
) -> None:
    run_id = new_id("run")
    blob = inline_blob(data)
    with session_scope(ctx.engine, write=True) as s:
        s.add(Run(id=run_id, worker_name="w", version_id="v", status=RunStatus.SUCCEEDED))
        s.flush()
        insert_blob(s, blob)
        s.add(RunLog(run_id=run_id, digest=blob.digest, lines=3, last_seq=3))

    with pytest.raises(BlobUnreadable) as unreadable:
        list_events(ctx, run_id=run_id, caller=SYSTEM)

    message = unreadable.value.message
    assert f"the log of run {run_id} is damaged" in message, message
    assert blob.digest in message, message
    assert said in message, message
