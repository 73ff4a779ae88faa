"""A real TCP load balancer for tests: round robin over backends, skipping those that refuse.

What operators put in front of several `pgdash serve` processes (HAProxy, a cloud load
balancer), reduced to what the cluster tests need: each new connection goes to the next
backend that accepts it, and bytes are copied both ways until either side closes.
"""

from __future__ import annotations

import socket
import threading


class Balancer:
    def __init__(self, backends: list[tuple[str, int]]):
        self.backends = backends
        self._listener = socket.socket()
        self._listener.bind(("127.0.0.1", 0))
        self._listener.listen(64)
        self.port = self._listener.getsockname()[1]
        self.url = f"http://127.0.0.1:{self.port}"
        self._next = 0
        self._lock = threading.Lock()
        self._sockets: list[socket.socket] = []
        self._used: list[int] = []  # backend index of each connection made
        self._stopping = False

    def start(self) -> "Balancer":
        threading.Thread(target=self._accept, name="balancer", daemon=True).start()
        return self

    def backends_used(self) -> set[int]:
        with self._lock:
            return set(self._used)

    def _pick(self) -> tuple[int, socket.socket] | None:
        for _ in range(len(self.backends)):
            with self._lock:
                index = self._next
                self._next = (self._next + 1) % len(self.backends)
            try:
                return index, socket.create_connection(self.backends[index], timeout=5)
            except OSError:
                continue  # that backend is down: the next one
        return None

    def _accept(self) -> None:
        while not self._stopping:
            try:
                client, _ = self._listener.accept()
            except OSError:
                return
            picked = self._pick()
            if picked is None:
                client.close()
                continue
            index, backend = picked
            backend.settimeout(None)
            with self._lock:
                self._used.append(index)
                self._sockets += [client, backend]
            for src, dst in ((client, backend), (backend, client)):
                threading.Thread(target=self._copy, args=(src, dst), daemon=True).start()

    @staticmethod
    def _copy(src: socket.socket, dst: socket.socket) -> None:
        try:
            while True:
                data = src.recv(65536)
                if not data:
                    break
                dst.sendall(data)
        except OSError:
            pass
        finally:  # one side gone: close both, as a proxy whose peer vanished does
            for s in (src, dst):
                try:
                    s.shutdown(socket.SHUT_RDWR)
                except OSError:
                    pass

    def stop(self) -> None:
        self._stopping = True
        self._listener.close()
        with self._lock:
            for s in self._sockets:
                try:
                    s.close()
                except OSError:
                    pass
