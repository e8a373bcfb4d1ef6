"""A TCP proxy in front of a real server that loses replies, delays them, or hangs.

``drop_reply_to(pattern)``: the next request whose bytes contain ``pattern`` reaches the
server (which acts on it), its reply is thrown away and the client's connection is cut, as
a timeout after the server acted looks to a client. ``delay`` adds latency to every reply;
``delay_replies_to(pattern, seconds)`` to the replies of the requests that contain
``pattern`` (the server acted at once: its answer comes late, as to a client descheduled
while it waits).
Nothing here imitates the server: every command is executed by the real one.
"""

from __future__ import annotations

import contextlib
import socket
import threading
import time
from collections.abc import Iterator
from typing import Any


class Proxy:
    def __init__(self, target_port: int, target_host: str = "127.0.0.1") -> None:
        self.target = (target_host, target_port)
        self.listener = socket.socket()
        self.listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self.listener.bind(("127.0.0.1", 0))
        self.listener.listen(64)
        self.port = int(self.listener.getsockname()[1])
        self.delay = 0.0
        self._patterns: list[bytes] = []
        self._slow: dict[bytes, float] = {}
        self.dropped: list[bytes] = []
        self._lock = threading.Lock()
        self._closed = False
        self._conns: list[socket.socket] = []
        threading.Thread(target=self._accept, daemon=True).start()

    def url(self, db: int = 0) -> str:
        return f"redis://127.0.0.1:{self.port}/{db}"

    def drop_reply_to(self, pattern: bytes | str, times: int = 1) -> None:
        """Lose the reply to the next ``times`` requests containing ``pattern``."""
        raw = pattern.encode() if isinstance(pattern, str) else pattern
        with self._lock:
            self._patterns += [raw] * times

    def delay_replies_to(self, pattern: bytes | str, seconds: float) -> None:
        """Delay by ``seconds`` the reply to every request that contains ``pattern``."""
        raw = pattern.encode() if isinstance(pattern, str) else pattern
        with self._lock:
            self._slow[raw] = seconds

    def pending(self) -> int:
        with self._lock:
            return len(self._patterns)

    def close(self) -> None:
        self._closed = True
        with contextlib.suppress(OSError):
            self.listener.close()
        for conn in list(self._conns):
            with contextlib.suppress(OSError):
                conn.close()

    def _accept(self) -> None:
        while not self._closed:
            try:
                client, _ = self.listener.accept()
            except OSError:
                return
            try:
                server = socket.create_connection(self.target, timeout=5)
            except OSError:
                client.close()
                continue
            server.settimeout(None)
            self._conns += [client, server]
            state: dict[str, Any] = {"dropping": False, "slow": 0.0}
            threading.Thread(target=self._up, args=(client, server, state), daemon=True).start()
            threading.Thread(target=self._down, args=(server, client, state),
                             daemon=True).start()

    def _match(self, data: bytes) -> bool:
        with self._lock:
            for i, pattern in enumerate(self._patterns):
                if pattern in data:
                    del self._patterns[i]
                    self.dropped.append(pattern)
                    return True
        return False

    def _slow_by(self, data: bytes) -> float:
        with self._lock:
            return max((s for p, s in self._slow.items() if p in data), default=0.0)

    def _up(self, client: socket.socket, server: socket.socket, state: dict[str, Any]
            ) -> None:
        try:
            while True:
                data = client.recv(65536)
                if not data:
                    break
                if self._match(data):
                    state["dropping"] = True  # before the server can answer
                    server.sendall(data)
                    time.sleep(0.2)  # the server acts and answers; the answer is thrown away
                    break
                slow = self._slow_by(data)
                if slow:
                    state["slow"] = slow  # (before the server can answer)
                server.sendall(data)
        except OSError:
            pass
        finally:
            for sock in (client, server):
                with contextlib.suppress(OSError):
                    sock.shutdown(socket.SHUT_RDWR)
                with contextlib.suppress(OSError):
                    sock.close()

    def _down(self, server: socket.socket, client: socket.socket, state: dict[str, Any]
              ) -> None:
        try:
            while True:
                data = server.recv(65536)
                if not data:
                    break
                if state["dropping"]:
                    continue
                if self.delay or state["slow"]:
                    time.sleep(self.delay + state["slow"])
                    state["slow"] = 0.0
                client.sendall(data)
        except OSError:
            pass
        finally:
            with contextlib.suppress(OSError):
                client.close()


@contextlib.contextmanager
def proxy(target_port: int) -> Iterator[Proxy]:
    p = Proxy(target_port)
    try:
        yield p
    finally:
        p.close()
