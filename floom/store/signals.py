"""Signals between the nodes of a cluster: PostgreSQL NOTIFY, heard by a LISTEN thread.

A signal is sent in the transaction of the change it announces, so it is delivered on
commit, when the change is visible, and never for a change that was rolled back. Signals
are hints, never the only path: a node that was not listening loses them, so on each
(re)connect the listener tells its owner to look at the database again.

The listener also proves, once a second, that it is caught up: it sends a heartbeat signal on
a channel of its own connection and hears it come back. PostgreSQL delivers a listening
connection's signals in commit order, so when a heartbeat sent at S is heard, every signal
of a change committed before S has been heard too. A node that is paused, or whose
connection is frozen (a proxy that passes no bytes, a half-open TCP connection that
keepalives do not end), hears no heartbeat, and what trusts the signals (the key cache,
floom/services/access/auth_cache.py) stops trusting them within its bound.
"""

from __future__ import annotations

import logging
import os
import select
import socket
import threading
import time
from collections.abc import Callable

from sqlalchemy import text
from sqlalchemy.engine import URL

from floom.store.db import Writer, on_postgres
from floom.store.statements import hot

log = logging.getLogger("floom.signals")

RUN_QUEUED = "floom_run_queued"  # a run became claimable (payload: none)
RUN_CANCEL = "floom_run_cancel"  # a running run is to stop (payload: its id)
KEY_REVOKED = "floom_key_revoked"  # an API key stopped being valid (payload: its hash)
SCHEDULES_CHANGED = "floom_schedules_changed"  # schedule triggers were synced (payload: none)
HANDOFFS_CHANGED = "floom_handoffs_changed"  # a handoff job took a lease, or bridges changed
CHANNELS = (RUN_QUEUED, RUN_CANCEL, KEY_REVOKED, SCHEDULES_CHANGED, HANDOFFS_CHANGED)
APPLICATION_NAME = "floom-listen"  # how the listener's connection shows in pg_stat_activity

# How long the listener waits for a signal before it looks at its connection again (a stop
# wakes it at once), and how long it waits before reconnecting after losing its connection.
WAIT_SECONDS = 1.0
RECONNECT_SECONDS = 1.0
# How often the listener sends itself a heartbeat (see the module's docstring). Each is a
# one-statement transaction on the listener's own connection: on the server, one notify
# queue entry and one transaction id a second per node.
HEARTBEAT_SECONDS = 1.0
HEARTBEAT_PREFIX = "floom_heard_"  # + random hex: a channel only this connection listens on


_NOTIFY = hot.Statement("signals.notify", lambda: text("SELECT pg_notify(:channel, :payload)"))


def publish(s: Writer, channel: str, payload: str = "") -> None:
    """Send `channel` when `s` commits (PostgreSQL); nothing on SQLite, where one process
    serves the database and wakes its own threads directly."""
    if on_postgres(s):
        _NOTIFY.rows(s, {"channel": channel, "payload": payload})


class Listener:
    """A thread with one connection of its own that LISTENs on CHANNELS.

    `on_signal(channel, payload)` is called for each signal, in the listener's thread;
    `on_connect()` after each (re)connect, before any signal (signals sent while the
    listener was away are lost); `on_disconnect()` when the connection is lost;
    `on_heard(sent_at)` when the heartbeat sent at `sent_at` (time.monotonic) came back:
    every signal committed before then was passed to `on_signal` already. A lost
    connection is retried every RECONNECT_SECONDS until `stop()`.
    """

    def __init__(
        self,
        url: URL,
        *,
        on_signal: Callable[[str, str], None],
        on_connect: Callable[[], None],
        on_disconnect: Callable[[], None],
        on_heard: Callable[[float], None] | None = None,
    ) -> None:
        self._conninfo = url.set(drivername="postgresql").render_as_string(hide_password=False)
        self._on_signal = on_signal
        self._on_connect = on_connect
        self._on_disconnect = on_disconnect
        self._on_heard = on_heard
        self._stop = threading.Event()
        # Written by stop() to wake the wait for a signal at once, not at its next timeout:
        # a node stops (and a test's server is torn down) without waiting up to a second.
        self._wake_reader, self._wake_writer = socket.socketpair()
        self._thread: threading.Thread | None = None
        self.connected = threading.Event()

    def start(self) -> None:
        self._thread = threading.Thread(target=self._loop, name="floom-listen", daemon=True)
        self._thread.start()

    def stop(self, timeout: float = 5.0) -> None:
        self._stop.set()
        self._wake_writer.send(b"x")
        if self._thread is not None:
            self._thread.join(timeout)
            if self._thread.is_alive():
                return  # still in a connect; its sockets close with the process
        self._wake_reader.close()
        self._wake_writer.close()

    def _loop(self) -> None:
        # Imported here: only a node on PostgreSQL listens, and psycopg costs a node on
        # SQLite about 8 MiB of resident memory.
        import psycopg

        while not self._stop.is_set():
            try:
                # Keepalives, so a connection to a vanished server is noticed in seconds; and
                # as a heartbeat is often in flight, a limit on unacknowledged data too
                # (keepalives only probe an idle connection).
                with psycopg.connect(
                    self._conninfo,
                    autocommit=True,
                    application_name=APPLICATION_NAME,
                    connect_timeout=5,
                    keepalives=1,
                    keepalives_idle=5,
                    keepalives_interval=2,
                    keepalives_count=2,
                    tcp_user_timeout=10_000,  # ms
                ) as conn:
                    # A channel of this connection's own: other nodes never hear its beats.
                    heard = f"{HEARTBEAT_PREFIX}{os.urandom(6).hex()}"
                    for channel in (*CHANNELS, heard):
                        conn.execute(f"LISTEN {channel}")
                    self.connected.set()
                    self._on_connect()
                    next_beat = 0.0
                    while not self._stop.is_set():
                        now = time.monotonic()
                        if now >= next_beat:
                            conn.execute("SELECT pg_notify(%s, %s)", (heard, repr(now)))
                            next_beat = now + HEARTBEAT_SECONDS
                        # What has arrived (also during the statements above), in order.
                        for note in conn.notifies(timeout=0):
                            if note.channel == heard:
                                if self._on_heard is not None:
                                    self._on_heard(float(note.payload))
                            else:
                                self._on_signal(note.channel, note.payload)
                        # Then wait for more, the next heartbeat, or a stop.
                        readable = [conn.fileno(), self._wake_reader.fileno()]
                        wait = min(WAIT_SECONDS, max(0.0, next_beat - time.monotonic()))
                        select.select(readable, [], [], wait)
            except psycopg.Error as exc:
                if self.connected.is_set():
                    log.warning("lost the signal connection (%s); polling meanwhile", exc)
            except Exception:  # the listener must outlive a bad handler; it reconnects
                log.exception("signal listener failed; reconnecting")
            if self.connected.is_set():
                self.connected.clear()
                self._on_disconnect()
            self._stop.wait(RECONNECT_SECONDS)
