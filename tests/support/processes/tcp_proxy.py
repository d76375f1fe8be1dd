"""A TCP proxy on loopback that a test can cut and restore: the database "goes away" for the
nodes behind it (connections dropped, new ones refused) without stopping the shared server.
It can also freeze: connections stay open and new ones are accepted, but no byte passes
either way until it thaws (a network partition that TCP keepalives do not notice)."""

from __future__ import annotations

import contextlib
import select
import selectors
import socket
import threading


class TcpProxy:
    def __init__(self, *, target: tuple[str, int], port: int) -> None:
        self.target = target
        self.port = port
        self._lock = threading.Lock()
        self._sockets: set[socket.socket] = set()
        self._listener: socket.socket | None = None
        self._stopped = threading.Event()
        self._flowing = threading.Event()
        self._flowing.set()
        self.restore()

    def restore(self) -> None:
        """Listen again on the same port."""
        listener = socket.socket()
        listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        listener.bind(("127.0.0.1", self.port))
        listener.listen(128)
        self._listener = listener
        threading.Thread(target=self._accept, args=(listener,), daemon=True).start()

    def cut(self) -> None:
        """Refuse new connections and drop every open one, as a lost server would."""
        if self._listener is not None:
            with contextlib.suppress(OSError):
                self._listener.shutdown(socket.SHUT_RDWR)
            self._listener.close()
            self._listener = None
        with self._lock:
            open_now, self._sockets = self._sockets, set()
        for sock in open_now:
            with contextlib.suppress(OSError):
                sock.shutdown(socket.SHUT_RDWR)
            sock.close()

    def freeze(self) -> None:
        """Pass no more bytes (what was sent waits in the sockets' buffers) until `thaw`."""
        self._flowing.clear()

    def thaw(self) -> None:
        self._flowing.set()

    def held(self) -> int:
        """How many of the proxied sockets (either side) have bytes waiting: while frozen,
        a count that grows when a node behind the proxy sends something new."""
        with self._lock:
            sockets = [s for s in self._sockets if s.fileno() >= 0]
        if not sockets:
            return 0
        try:
            readable, _, _ = select.select(sockets, [], [], 0)
        except (OSError, ValueError):
            return 0  # a socket closed meanwhile; ask again
        return len(readable)

    def close(self) -> None:
        self._stopped.set()
        self._flowing.set()
        self.cut()

    def _accept(self, listener: socket.socket) -> None:
        while not self._stopped.is_set():
            try:
                client, _ = listener.accept()
            except OSError:
                return  # cut
            try:
                upstream = socket.create_connection(self.target, timeout=5)
            except OSError:
                client.close()
                continue
            with self._lock:
                self._sockets.update((client, upstream))
            threading.Thread(target=self._pump, args=(client, upstream), daemon=True).start()

    def _pump(self, a: socket.socket, b: socket.socket) -> None:
        selector = selectors.DefaultSelector()
        selector.register(a, selectors.EVENT_READ, b)
        selector.register(b, selectors.EVENT_READ, a)
        try:
            while True:
                if not self._flowing.is_set():
                    self._flowing.wait(timeout=1.0)
                    continue
                ready = selector.select(timeout=1.0)
                if not self._flowing.is_set():
                    continue  # frozen while waiting: the bytes stay where they are
                for key, _ in ready:
                    data = key.fileobj.recv(65536)  # type: ignore[union-attr]
                    if not data:
                        return
                    key.data.sendall(data)
        except (OSError, ValueError):
            return  # a side closed or was cut
        finally:
            selector.close()
            with self._lock:
                self._sockets.discard(a)
                self._sockets.discard(b)
            for sock in (a, b):
                sock.close()
