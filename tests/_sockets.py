"""A loopback server that accepts connections and never answers (a stand-in for a
wrong port or a stuck scheduler), for the tests of bounded waits."""

from __future__ import annotations

import contextlib
import socket
import threading
from collections.abc import Iterator


@contextlib.contextmanager
def silent_server(lifetime: float = 30.0) -> Iterator[tuple[str, list[socket.socket]]]:
    """``(tcp://127.0.0.1:PORT, accepted connections)``. After ``lifetime`` seconds it
    stops accepting and closes what it accepted, so that a wait it should have
    bounded ends in an error instead of hanging the suite."""
    server = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    server.bind(("127.0.0.1", 0))
    server.listen(16)
    server.settimeout(0.2)
    accepted: list[socket.socket] = []
    stop = threading.Event()

    def serve() -> None:
        while not stop.is_set():
            with contextlib.suppress(OSError):
                accepted.append(server.accept()[0])
        for connection in accepted:
            connection.close()

    thread = threading.Thread(target=serve, daemon=True)
    thread.start()
    timer = threading.Timer(lifetime, stop.set)
    timer.start()
    try:
        yield f"tcp://127.0.0.1:{server.getsockname()[1]}", accepted
    finally:
        stop.set()
        timer.cancel()
        thread.join()
        server.close()
