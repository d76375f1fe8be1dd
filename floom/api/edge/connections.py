"""The HTTP connections a node holds, bounded before any request reaches the app.

uvicorn bounds none of this itself: a connection that never sends its request, or sends
its headers a byte every few seconds (a slow-loris), is held for good; httptools (its
parser) keeps every header byte it is sent, with no limit; and connections are accepted
until the process runs out of file descriptors, after which no one is served. So, per
connection, from the moment it waits for a request (opened, or its last response done)
until that request's headers are in: FLOOM_REQUEST_HEADER_SECONDS (then closed; answered
408 `request_timeout` when part of a request had come), at most FLOOM_MAX_HEADER_BYTES of
request line and headers and MAX_HEADER_FIELDS fields (past either, 431
`headers_too_large`). A node holds at most FLOOM_MAX_CONNECTIONS connections (and no more
than half its open-file limit): one more closes the connection that has waited longest for
a request, so idle connections cannot keep requests out; when every connection is busy with
a request, the new one is answered 503 and closed.

Nor does uvicorn bound how long an answer may wait on its client: it writes as fast as the
client reads, so a client that opens a log stream (or any long answer) and then reads nothing
held its connection, and its stream's place, for as long as the run lasted; one gone without
a word (half-open, no reset) was found only by the kernel's retransmission limit, about a
quarter of an hour. So, on Linux, a connection with bytes sent that its client's TCP has
acknowledged none of for FLOOM_RESPONSE_SEND_SECONDS (its window shut by a reader that reads
nothing, or no answer at all) is closed; a stream's keep-alive comment is enough to be such a
byte. Progress is the kernel's count of bytes acknowledged, so a client that reads, however
slowly, is not cut. (Neither uvicorn's pause_writing nor the kernel's TCP_USER_TIMEOUT will
do: the first comes only once the kernel's send buffer is full, megabytes on a quiet stream;
the second cut a client that read every half deadline through a small window.)
"""

from __future__ import annotations

import fcntl
import json
import logging
import resource
import socket
import struct
import termios
from asyncio import TimerHandle, Transport
from typing import Any, ClassVar

from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol

from floom.config import Settings
from floom.errors import BodyTooSlow, FloomError, HeadersTooLarge, ServerBusy

log = logging.getLogger("floom.api")

# Header fields one request may carry: browsers send about 20; this leaves a proxy room.
MAX_HEADER_FIELDS = 200
# After a refused head, what the client still sends is read and dropped for this long (or
# this much) before the connection closes.
LINGER_SECONDS = 2.0
LINGER_BYTES = 4 * 1024 * 1024


class _HeadRefused(Exception):
    """Raised from the parser's callbacks to stop it: the head is refused."""


class GuardedHttpProtocol(HttpToolsProtocol):
    """uvicorn's httptools protocol with the bounds above; `guarded_protocol` makes one with
    a node's settings."""

    header_seconds: ClassVar[float] = 15.0
    max_header_bytes: ClassVar[int] = 64 * 1024
    max_connections: ClassVar[int] = 1000
    send_seconds: ClassVar[float] = 60.0

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._head_timer: TimerHandle | None = None
        self._send_timer: TimerHandle | None = None
        # The kernel's count of bytes the client acknowledged, and when (loop time) it last
        # moved or nothing was left to send.
        self._acked = 0
        self._progress_at = 0.0
        # Since when (loop time) it has waited for a request; None while one is served.
        self.waiting_since: float | None = None
        self._in_head = False
        self._head_bytes = 0
        self._fields = 0
        self._refusal: FloomError | None = None
        # Within a request's message (its head read, not all of its body): whether the
        # last read carried body bytes, and the bytes read in a row that carried none.
        self._in_message = False
        self._body_arrived = False
        self._bodiless = 0
        # Bytes read and dropped since a head was refused; None until then.
        self._lingered: int | None = None

    def connection_made(self, transport: Transport) -> None:  # type: ignore[override]
        if len(self.connections) >= self.max_connections and not self._close_longest_idle():
            self.transport = transport
            log.warning(
                "refused a connection: %d held, every one serving a request "
                "(FLOOM_MAX_CONNECTIONS)",
                len(self.connections),
            )
            transport.write(_answer(ServerBusy(hint="try again shortly")))
            transport.close()
            return
        super().connection_made(transport)
        self._await_request()
        if _send_progress(transport) is not None:
            self._progress_at = self.loop.time()
            self._check_send_later()

    def connection_lost(self, exc: Exception | None) -> None:
        self._cancel_head_timer()
        self._cancel_send_timer()
        if self.flow is None:  # refused in connection_made: never set up
            return
        super().connection_lost(exc)

    def _check_send_later(self) -> None:
        self._send_timer = self.loop.call_later(self.send_seconds / 4, self._check_send)

    def _cancel_send_timer(self) -> None:
        if self._send_timer is not None:
            self._send_timer.cancel()
            self._send_timer = None

    def _check_send(self) -> None:
        self._send_timer = None
        if self.transport.is_closing():
            return
        progress = _send_progress(self.transport)
        if progress is None:
            return
        acked, outstanding = progress
        now = self.loop.time()
        if acked != self._acked or not (outstanding or self.transport.get_write_buffer_size()):
            self._acked, self._progress_at = acked, now
        elif now - self._progress_at >= self.send_seconds:
            log.warning(
                "closed a connection whose client acknowledged none of what was sent to it "
                "for %g s (FLOOM_RESPONSE_SEND_SECONDS)",
                self.send_seconds,
            )
            # Not close(): that waits for the unsent answer to be written, the very wait
            # being ended.
            self.transport.abort()
            return
        self._check_send_later()

    def data_received(self, data: bytes) -> None:
        if self._lingered is not None:
            self._linger(len(data))
            return
        in_head, in_message = self._in_head, self._in_message
        self._body_arrived = False
        super().data_received(data)
        if self.transport.is_closing():
            return
        if in_message and self._in_message:
            self._count_bodiless(len(data))
        if not self._in_head:
            return
        # Counted only for reads wholly inside a head: at most one read (of the transport's
        # size) beyond the limit is ever held.
        if in_head:
            self._head_bytes += len(data)
        if self._head_bytes > self.max_header_bytes:
            self._refuse_head(self._too_large(f"over {self.max_header_bytes} bytes"))

    def send_400_response(self, msg: str) -> None:
        if self._refusal is not None:  # the parser stopped because a callback refused
            self._refuse_head(self._refusal)
            return
        super().send_400_response(msg)

    def on_message_begin(self) -> None:
        super().on_message_begin()
        self._in_head = True
        self._head_bytes = 0
        self._fields = 0

    def on_header(self, name: bytes, value: bytes) -> None:
        self._fields += 1
        if self._fields > MAX_HEADER_FIELDS:
            self._refusal = self._too_large(f"over {MAX_HEADER_FIELDS} header fields")
            raise _HeadRefused
        super().on_header(name, value)

    def on_headers_complete(self) -> None:
        self._in_head = False
        self.waiting_since = None
        self._cancel_head_timer()
        self._in_message, self._bodiless = True, 0
        super().on_headers_complete()

    def on_body(self, body: bytes) -> None:
        self._body_arrived = True
        super().on_body(body)

    def on_message_complete(self) -> None:
        self._in_message = False
        super().on_message_complete()

    def _count_bodiless(self, read: int) -> None:
        """A chunked body's framing, extensions and trailers are held by the parser, outside
        the body's flow control: reads in a row that carry no body byte are bounded as a
        head is, and past it the connection is closed (its request is being served, so
        nothing can be answered on it)."""
        if self._body_arrived:
            self._bodiless = 0
            return
        self._bodiless += read
        if self._bodiless > self.max_header_bytes:
            log.warning(
                "closed a connection that sent over %d bytes of a chunked body's framing or "
                "trailers (FLOOM_MAX_HEADER_BYTES)",
                self.max_header_bytes,
            )
            self.transport.close()

    def on_response_complete(self) -> None:
        waiting = not self.pipeline  # else the next request's head is in already
        super().on_response_complete()
        if waiting and not self.transport.is_closing():
            self._await_request()

    def _await_request(self) -> None:
        self._cancel_head_timer()
        self.waiting_since = self.loop.time()
        self._head_timer = self.loop.call_later(self.header_seconds, self._head_too_slow)

    def _cancel_head_timer(self) -> None:
        if self._head_timer is not None:
            self._head_timer.cancel()
            self._head_timer = None

    def _head_too_slow(self) -> None:
        self._head_timer = None
        if self.transport.is_closing():
            return
        if not self._in_head:  # nothing of a request came: closed without a word
            self.transport.close()
            return
        log.warning(
            "refused a request whose headers did not arrive within %g s "
            "(FLOOM_REQUEST_HEADER_SECONDS)",
            self.header_seconds,
        )
        self._refuse_head(
            BodyTooSlow(
                f"the request headers did not arrive within {self.header_seconds:g} seconds",
                hint="send the whole request at once",
            )
        )

    def _too_large(self, what: str) -> HeadersTooLarge:
        log.warning("refused a request whose headers are %s (FLOOM_MAX_HEADER_BYTES)", what)
        return HeadersTooLarge(
            f"the request line and headers are {what}", hint="send fewer or shorter headers"
        )

    def _refuse_head(self, error: FloomError) -> None:
        """Answer `error`, then read and drop what the client still sends for a moment
        before closing: closed with its bytes unread, the connection would be reset and the
        client would never read why."""
        self._in_head = False
        self.waiting_since = None
        self._cancel_head_timer()
        self._lingered = 0
        self.transport.write(_answer(error))
        if self.transport.can_write_eof():
            self.transport.write_eof()
        self._head_timer = self.loop.call_later(LINGER_SECONDS, self.transport.close)

    def _linger(self, dropped: int) -> None:
        self._lingered = (self._lingered or 0) + dropped
        if self._lingered > LINGER_BYTES:
            self.transport.close()

    def _close_longest_idle(self) -> bool:
        """Close the connection that has waited longest for a request; False if none waits."""
        idle = [
            c
            for c in self.connections
            if isinstance(c, GuardedHttpProtocol) and c.waiting_since is not None
        ]
        if not idle:
            return False
        longest = min(idle, key=lambda c: c.waiting_since or 0.0)
        self.connections.discard(longest)
        longest._cancel_head_timer()
        longest.transport.close()
        return True


# struct tcp_info (linux/tcp.h): tcpi_bytes_acked, a u64 at byte 120 (Linux 4.1 and later).
_BYTES_ACKED = struct.Struct("=Q")
_BYTES_ACKED_AT = 120
_OUTQ = struct.Struct("=i")
_TCP_INFO = getattr(socket, "TCP_INFO", None)


def _send_progress(transport: Transport) -> tuple[int, int] | None:
    """The bytes the client's TCP has acknowledged so far on this connection, and the bytes
    in the kernel not yet acknowledged; None where the kernel does not tell (not Linux, not
    TCP)."""
    sock = transport.get_extra_info("socket")
    if _TCP_INFO is None or sock is None or sock.family not in (socket.AF_INET, socket.AF_INET6):
        return None
    try:
        info = sock.getsockopt(socket.IPPROTO_TCP, _TCP_INFO, _BYTES_ACKED_AT + 8)
        if len(info) < _BYTES_ACKED_AT + 8:
            return None
        (acked,) = _BYTES_ACKED.unpack_from(info, _BYTES_ACKED_AT)
        queued = fcntl.ioctl(sock.fileno(), termios.TIOCOUTQ, bytes(_OUTQ.size))
    except OSError:  # the socket is closing: its connection_lost is on its way
        return None
    (outstanding,) = _OUTQ.unpack(queued)
    return acked, outstanding


def _answer(error: FloomError) -> bytes:
    """`error` as an answer in floom's error shape, that closes its connection."""
    body = json.dumps({"error": error.to_dict()}).encode()
    head = (
        f"HTTP/1.1 {error.status} {_REASONS.get(error.status, '')}\r\n"
        "content-type: application/json\r\n"
        f"content-length: {len(body)}\r\n"
        "connection: close\r\n\r\n"
    )
    return head.encode() + body


_REASONS = {
    408: "Request Timeout",
    431: "Request Header Fields Too Large",
    503: "Service Unavailable",
}


def guarded_protocol(settings: Settings) -> type[GuardedHttpProtocol]:
    """The protocol class for uvicorn's `http` (its Config) with `settings`' bounds."""
    soft, _ = resource.getrlimit(resource.RLIMIT_NOFILE)
    # Half the process's descriptors at most: the rest are the database's, the sandboxes'
    # and the logs'. An accept that finds none left stops serving anyone.
    cap = settings.max_connections
    if soft != resource.RLIM_INFINITY:
        cap = max(1, min(cap, soft // 2))
    return type(
        "GuardedHttpProtocol",
        (GuardedHttpProtocol,),
        {
            "header_seconds": settings.request_header_seconds,
            "max_header_bytes": settings.max_header_bytes,
            "max_connections": cap,
            "send_seconds": settings.response_send_seconds,
        },
    )
