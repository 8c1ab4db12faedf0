"""A raw HTTP/1.1 server on 127.0.0.1 for the engine's tests (test_transport_sync.py,
test_transport_aio.py, test_direct.py): answers each request with a function of its
bytes, counts connections, can hang up after answering or instead of answering."""

from __future__ import annotations

import contextlib
import socket
import ssl
import threading
from collections.abc import Callable

Answer = Callable[[bytes], bytes | None]  # request head + body -> raw answer (None: hang up)


class RawServer:
    """Accepts connections and answers each request with `answer`; counts connections."""

    def __init__(self, answer: Answer, tls: ssl.SSLContext | None = None) -> None:
        self.answer, self.tls = answer, tls
        self.sock = socket.create_server(("127.0.0.1", 0))
        scheme = "https" if tls is not None else "http"
        self.url = f"{scheme}://127.0.0.1:{self.sock.getsockname()[1]}"
        self.connections = 0
        self.hang_up_after = False  # answer, then close without saying so
        self.requests: list[bytes] = []
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        while True:
            try:
                conn, _ = self.sock.accept()
            except OSError:
                return
            self.connections += 1
            threading.Thread(target=self._serve, args=(conn,), daemon=True).start()

    def _serve(self, conn: socket.socket) -> None:
        with contextlib.suppress(OSError):  # the client may hang up mid-answer
            if self.tls is not None:
                conn = self.tls.wrap_socket(conn, server_side=True)
            self._exchange(conn)

    def _exchange(self, conn: socket.socket) -> None:
        buf = b""
        with conn:
            while True:
                while b"\r\n\r\n" not in buf:
                    data = conn.recv(65536)
                    if not data:
                        return
                    buf += data
                head, _, buf = buf.partition(b"\r\n\r\n")
                body = b""
                for line in head.split(b"\r\n"):
                    if line.lower().startswith(b"content-length:"):
                        n = int(line.split(b":")[1])
                        while len(buf) < n:
                            buf += conn.recv(65536)
                        body, buf = buf[:n], buf[n:]
                    elif line.lower().startswith(b"transfer-encoding: chunked"):
                        while not buf.endswith(b"0\r\n\r\n"):
                            buf += conn.recv(65536)
                        body, buf = _dechunk(buf), b""
                self.requests.append(head + b"\r\n\r\n" + body)
                out = self.answer(head + b"\r\n\r\n" + body)
                if out is None:
                    return
                conn.sendall(out)
                if self.hang_up_after or b"connection: close" in out.lower():
                    return

    def close(self) -> None:
        self.sock.close()


def _dechunk(raw: bytes) -> bytes:
    out = b""
    while True:
        size, _, raw = raw.partition(b"\r\n")
        n = int(size, 16)
        if n == 0:
            return out
        out, raw = out + raw[:n], raw[n + 2:]


def ok(body: bytes = b'{"ok":true}', extra: bytes = b"") -> bytes:
    return (b"HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: "
            + str(len(body)).encode() + b"\r\n" + extra + b"\r\n" + body)




def chunked_echo(req: bytes) -> bytes:
    """The request's body sent back chunked, in two parts."""
    body = req.partition(b"\r\n\r\n")[2]
    return (b"HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\n\r\n"
            + b"".join(b"%x\r\n%s\r\n" % (len(p), p) for p in (body[:3], body[3:]) if p)
            + b"0\r\n\r\n")
