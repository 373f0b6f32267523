"""A TCP proxy on 127.0.0.1 that can stop forwarding without closing anything: a partition.

``pause()`` stops reading from every socket and stops accepting, so nothing crosses either
way and no RST or FIN is sent: the client's kernel still sees its bytes acknowledged (by this
process's kernel, whose buffers fill up) and its peer alive, exactly as when packets are
dropped somewhere in between, except that keepalive probes are answered here too (so this
cannot test keepalives or ``tcp_user_timeout``, only what a client does without any answer).
New connections complete the TCP handshake in the listen backlog and wait there.
``resume()`` delivers everything that queued up meanwhile, in order, both ways: a write sent
during the partition reaches the server late, as it would after a real partition heals.

One thread with a selector; a side that reaches its end (FIN) is passed on as a half close
(``SHUT_WR``) to the other side, an error on either side closes both.
"""

from __future__ import annotations

import contextlib
import selectors
import socket
import threading


class PartitionProxy:
    """Forwards ``127.0.0.1:<port>`` to ``target_host:target_port`` until ``close()``."""

    def __init__(self, target_port: int, target_host: str = "127.0.0.1") -> None:
        self._target = (target_host, target_port)
        self._listener = socket.create_server(("127.0.0.1", 0), backlog=128)
        self._listener.setblocking(False)
        #: The port to point clients at.
        self.port: int = self._listener.getsockname()[1]
        self._peers: dict[socket.socket, socket.socket] = {}
        # Sides that reached their end (their peer may still be sending).
        self._ended: set[socket.socket] = set()
        self._clients: set[socket.socket] = set()
        self._lock = threading.Lock()
        self._paused = False
        self._closing = False
        # The selector thread acknowledges a pause once it forwards nothing more.
        self._paused_ack = threading.Event()
        self._wake_recv, self._wake_send = socket.socketpair()
        #: Bytes forwarded from clients to the server since the last ``resume()``.
        self.sent_after_resume = 0
        self._thread = threading.Thread(target=self._serve, name="partition-proxy", daemon=True)
        self._thread.start()

    def url(self, user: str = "postgres", database: str = "postgres") -> str:
        """A URL of ``database`` through the proxy (trust auth: no password)."""
        return f"postgresql://{user}@127.0.0.1:{self.port}/{database}"

    def pause(self) -> None:
        """Stop forwarding (returns once nothing more crosses); connections stay open."""
        with self._lock:
            self._paused = True
            self._paused_ack.clear()
        self._poke()
        if not self._paused_ack.wait(5):
            raise RuntimeError("the proxy thread did not pause")

    def resume(self) -> None:
        """Forward again, starting with whatever queued up during the pause."""
        with self._lock:
            self._paused = False
            self.sent_after_resume = 0
        self._poke()

    def connections(self) -> int:
        """Client connections still open through the proxy."""
        with self._lock:
            return len(self._peers) // 2

    def close(self) -> None:
        """Stop the thread and close every socket."""
        with self._lock:
            self._closing = True
        self._poke()
        self._thread.join(5)
        for sock in [*self._peers, self._listener, self._wake_recv, self._wake_send]:
            sock.close()

    # --- the selector thread ------------------------------------------------------------

    def _poke(self) -> None:
        with contextlib.suppress(OSError):
            self._wake_send.send(b"x")

    def _serve(self) -> None:
        selector = selectors.DefaultSelector()
        selector.register(self._wake_recv, selectors.EVENT_READ)
        watching = False  # whether the listener and the connections are registered
        while True:
            with self._lock:
                closing, paused = self._closing, self._paused
            if closing:
                return
            if paused and watching:
                for sock in [self._listener, *self._peers]:
                    with contextlib.suppress(KeyError, ValueError):
                        selector.unregister(sock)
                watching = False
            if paused:
                self._paused_ack.set()
            elif not watching:
                selector.register(self._listener, selectors.EVENT_READ)
                for sock in self._peers:
                    if sock not in self._ended:
                        selector.register(sock, selectors.EVENT_READ)
                watching = True
            for key, _ in selector.select():
                sock = key.fileobj
                assert isinstance(sock, socket.socket)
                if sock is self._wake_recv:
                    self._wake_recv.recv(4096)
                    break  # look at the flags again before touching anything else
                if sock is self._listener:
                    self._accept(selector)
                elif sock in self._peers:
                    self._forward(selector, sock)

    def _accept(self, selector: selectors.BaseSelector) -> None:
        try:
            client, _ = self._listener.accept()
        except BlockingIOError:
            return
        try:
            server = socket.create_connection(self._target, timeout=5)
        except OSError:
            client.close()
            return
        client.setblocking(True)
        server.setblocking(True)
        with self._lock:
            self._peers[client] = server
            self._peers[server] = client
        self._clients.add(client)
        selector.register(client, selectors.EVENT_READ)
        selector.register(server, selectors.EVENT_READ)

    def _forward(self, selector: selectors.BaseSelector, sock: socket.socket) -> None:
        peer = self._peers[sock]
        try:
            data = sock.recv(65536)
            if data:
                peer.sendall(data)
                if sock in self._clients:
                    with self._lock:
                        self.sent_after_resume += len(data)
                return
            # This side ended: pass the half close on; once both ended, forget the pair.
            selector.unregister(sock)
            self._ended.add(sock)
            peer.shutdown(socket.SHUT_WR)
            if peer not in self._ended:
                return
        except OSError:
            for one in (sock, peer):
                with contextlib.suppress(KeyError, ValueError):
                    selector.unregister(one)
        with self._lock:
            self._peers.pop(sock, None)
            self._peers.pop(peer, None)
        for one in (sock, peer):
            self._ended.discard(one)
            self._clients.discard(one)
        sock.close()
        peer.close()
