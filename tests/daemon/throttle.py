"""A slow network in front of a real ``git daemon``: a TCP proxy on 127.0.0.1 that forwards
what clients send at a fixed rate, and can stop forwarding mid-transfer (a stalled link).

Only the bytes move through this code; both ends are the real git (a ``git push`` and the
``git daemon``'s ``receive-pack``).
"""

from __future__ import annotations

import socket
import threading
import time

_WINDOW = 16 << 10   # small socket buffers: the client feels the rate, not a kernel buffer


class ThrottledProxy:
    """Forwards ``127.0.0.1:port`` to ``127.0.0.1:target``; client bytes at ``rate`` bytes/s.

    ``stall_after``: the first connection to send that many bytes stops forwarding there
    (until :meth:`stop`), like a link that went dead mid-push; every other one flows.
    """

    def __init__(self, target: int, *, rate: float, stall_after: int | None = None) -> None:
        self.target, self.rate, self.stall_after = target, rate, stall_after
        self.forwarded = 0          # client -> server bytes, all connections
        self.connections = 0
        self.stalled = threading.Event()   # set when a connection stopped forwarding
        self._stop = threading.Event()
        self._lock = threading.Lock()
        self._sockets: list[socket.socket] = []
        self._threads: list[threading.Thread] = []
        self._listener = socket.socket()
        self._listener.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, _WINDOW)
        self._listener.bind(("127.0.0.1", 0))
        self._listener.listen(8)
        self.port = self._listener.getsockname()[1]

    def url(self, name: str) -> str:
        return f"git://127.0.0.1:{self.port}/{name}"

    def start(self) -> "ThrottledProxy":
        self._spawn(self._accept)
        return self

    def stop(self) -> None:
        self._stop.set()
        with self._lock:
            sockets = [self._listener, *self._sockets]
        for sock in sockets:
            try:
                sock.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass
            sock.close()
        for thread in list(self._threads):
            thread.join(10)

    def _spawn(self, target, *args) -> None:
        thread = threading.Thread(target=target, args=args, daemon=True)
        self._threads.append(thread)
        thread.start()

    def _accept(self) -> None:
        while not self._stop.is_set():
            try:
                client, _ = self._listener.accept()
                upstream = socket.create_connection(("127.0.0.1", self.target))
            except OSError:
                return
            upstream.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, _WINDOW)
            with self._lock:
                self._sockets += [client, upstream]
                self.connections += 1
            self._spawn(self._pump, client, upstream, self.rate)
            self._spawn(self._pump, upstream, client, None)

    def _should_stall(self, sent: int) -> bool:
        with self._lock:
            if self.stall_after is None or sent < self.stall_after or self.stalled.is_set():
                return False
            self.stalled.set()
            return True

    def _pump(self, source: socket.socket, sink: socket.socket, rate: float | None) -> None:
        sent = 0
        chunk = 4096 if rate else 1 << 16
        try:
            while not self._stop.is_set():
                if rate and self._should_stall(sent):
                    self._stop.wait()  # a dead link: nothing moves until the end
                    return
                data = source.recv(chunk)
                if not data:
                    break
                sink.sendall(data)
                sent += len(data)
                if rate:
                    with self._lock:
                        self.forwarded += len(data)
                    time.sleep(len(data) / rate)
        except OSError:
            pass
        finally:
            try:
                sink.shutdown(socket.SHUT_WR)
            except OSError:
                pass
