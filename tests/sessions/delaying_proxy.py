"""A TCP proxy on loopback that holds some of the server's replies back: what a slow network or an overloaded
store does to a client that times out and retries."""

from __future__ import annotations

import contextlib
import random
import socket
import threading
import time


class DelayingProxy:
    """Forwards 127.0.0.1:``port`` to ``target``; each reply chunk of the server is held ``delay_s`` with
    probability ``share`` (``seed`` fixes which). Stops with its ``with`` block."""

    def __init__(self, target: tuple[str, int], delay_s: float, share: float = 1.0, seed: int = 0):
        self.target, self.delay_s, self.share = target, delay_s, share
        self.random = random.Random(seed)
        self.listener = socket.create_server(("127.0.0.1", 0))
        self.port = self.listener.getsockname()[1]
        self.delayed = 0
        self._stop = threading.Event()
        self._sockets: list[socket.socket] = []

    def __enter__(self) -> DelayingProxy:
        threading.Thread(target=self._accept, daemon=True).start()
        return self

    def __exit__(self, *exc) -> None:
        self._stop.set()
        for s in [self.listener, *self._sockets]:
            with contextlib.suppress(OSError):
                s.close()

    def _accept(self) -> None:
        while not self._stop.is_set():
            try:
                client, _ = self.listener.accept()
            except OSError:
                return
            server = socket.create_connection(self.target)
            self._sockets += [client, server]
            threading.Thread(target=self._pipe, args=(client, server, False), daemon=True).start()
            threading.Thread(target=self._pipe, args=(server, client, True), daemon=True).start()

    def _pipe(self, source: socket.socket, sink: socket.socket, replies: bool) -> None:
        try:
            while chunk := source.recv(65536):
                if replies and self.random.random() < self.share:
                    self.delayed += 1
                    time.sleep(self.delay_s)
                sink.sendall(chunk)
        except OSError:
            pass
        finally:
            for s in (source, sink):
                with contextlib.suppress(OSError):
                    s.shutdown(socket.SHUT_RDWR)
