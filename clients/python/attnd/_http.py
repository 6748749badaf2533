"""A small HTTP/1.1 client connection for plain ``http://`` URLs, in place of http.client's.

http.client sends a request's head and its body in two writes and parses every answer's head
with the email package: for a one-token call to the ``small`` preset, that took about 0.05 ms of
the ~0.16 ms a call cost from Python (the server computed ~0.03). This one writes a request in
one go, reads the status line and header fields itself, and reads a body framed by
Content-Length, by chunks (a stream's events) or by the connection's close. It keeps
http.client's interface where the client uses it (``request``, ``getresponse``, ``status``,
``headers.get``, ``read``, ``readline``, ``will_close``, ``close``) and raises its exceptions
(``RemoteDisconnected`` when the server closed before answering, ``HTTPException`` for an answer
it cannot read), so the retry rules stay the same. ``https://`` stays on http.client.
"""

import http.client
import re
import socket
from typing import Dict, List, Mapping, Optional, Union

_MAX_LINE = 65536  # as http.client: a longer status or header line is refused
_BAD_TARGET = re.compile(r"[\x00-\x20\x7f]")
_BAD_NAME = re.compile(r"[:\x00\t\n\r ]")
_BAD_VALUE = re.compile(r"[\x00\n\r]")
_CHUNK_SIZE = re.compile(rb"[0-9A-Fa-f]{1,16}")
_MAX_HEADERS = 100
_CHUNK_READ = 65536


class Headers(Dict[str, str]):
    """An answer's header fields by lower-case name (a repeated field's values joined by ", ");
    ``get`` takes any case."""

    def get(self, name: str, default: Optional[str] = None) -> Optional[str]:  # type: ignore
        return super().get(name.lower(), default)

    def __getitem__(self, name: str) -> str:
        return super().__getitem__(name.lower())

    def __contains__(self, name: object) -> bool:
        return isinstance(name, str) and super().__contains__(name.lower())


class Response:
    """One answer, read from its connection's buffered reader."""

    def __init__(self, reader, method: str) -> None:  # type: ignore[no-untyped-def]
        self._fp = reader
        self.status, self.reason, version = self._status_line()
        while 100 <= self.status < 200 and self.status != 101:
            self._read_fields()  # an interim answer (100 Continue): its fields, then the real one
            self.status, self.reason, version = self._status_line()
        self.headers = self._read_fields()
        connection = (self.headers.get("connection") or "").lower()
        self.will_close = version == "HTTP/1.0" or "close" in connection
        self._chunked = "chunked" in (self.headers.get("transfer-encoding") or "").lower()
        self._left: Optional[int] = None  # body bytes still to read, None: to the close
        if method == "HEAD" or self.status in (204, 304) or 100 <= self.status < 200:
            self._left = 0
            self._chunked = False
        elif not self._chunked and self.headers.get("content-length") is not None:
            try:
                self._left = int(self.headers["content-length"])
            except ValueError:
                raise http.client.HTTPException("a Content-Length that is not a number") from None
            if self._left < 0:
                raise http.client.HTTPException("a negative Content-Length")
        elif not self._chunked:
            self.will_close = True  # the body runs to the close: nothing can follow it
        self._chunk_left = 0  # bytes left in the current chunk
        self._chunks_done = False
        self._pending = bytearray()  # decoded bytes readline has read ahead

    def _line(self) -> bytes:
        line = self._fp.readline(_MAX_LINE + 1)
        if len(line) > _MAX_LINE:
            raise http.client.LineTooLong("header line")
        return line

    def _status_line(self):  # type: ignore[no-untyped-def]
        line = self._line()
        if not line:
            raise http.client.RemoteDisconnected("Remote end closed connection without response")
        parts = line.decode("iso-8859-1").rstrip("\r\n").split(None, 2)
        if len(parts) < 2 or not parts[0].startswith("HTTP/") or not parts[1].isdigit():
            raise http.client.BadStatusLine(line.decode("iso-8859-1", "replace"))
        return int(parts[1]), parts[2] if len(parts) > 2 else "", parts[0]

    def _read_fields(self) -> Headers:
        h = Headers()
        for _ in range(_MAX_HEADERS + 1):
            line = self._line()
            if line in (b"\r\n", b"\n"):
                return h
            if not line:
                raise http.client.IncompleteRead(b"", None)
            name, sep, value = line.decode("iso-8859-1").partition(":")
            if not sep:
                raise http.client.HTTPException(f"a header line without a colon: {line!r}")
            key = name.strip().lower()
            value = value.strip()
            h[key] = h[key] + ", " + value if dict.__contains__(h, key) else value
        raise http.client.HTTPException(f"more than {_MAX_HEADERS} headers")

    def _exact(self, n: int) -> bytes:
        data = self._fp.read(n)
        if len(data) < n:
            raise http.client.IncompleteRead(data, n - len(data))
        return data

    def _next_chunk(self) -> bool:
        """Reads the next chunk's size line; False after the last chunk and its trailer."""
        if self._chunks_done:
            return False
        size = self._line().split(b";", 1)[0].strip()
        # hex digits only (RFC 9112's chunk-size): int() would also take "-1", "0x10" or "1_0",
        # and a negative size read on to the connection's end
        if not _CHUNK_SIZE.fullmatch(size):
            raise http.client.HTTPException(f"a bad chunk size: {size!r}")
        n = int(size, 16)
        if n == 0:
            self._read_fields()  # the trailer, up to its empty line
            self._chunks_done = True
            return False
        self._chunk_left = n
        return True

    def _chunk_bytes(self, limit: int) -> bytes:
        """Up to limit bytes of the body's chunks, b"" at its end."""
        if self._chunk_left == 0 and not self._next_chunk():
            return b""
        data = self._exact(min(limit, self._chunk_left))
        self._chunk_left -= len(data)
        if self._chunk_left == 0:
            self._exact(2)  # the CRLF after a chunk's data
        return data

    def read(self) -> bytes:
        """The whole (rest of the) body."""
        head = bytes(self._pending)
        self._pending.clear()
        if self._chunked:
            parts: List[bytes] = [head]
            while True:
                data = self._chunk_bytes(_CHUNK_READ)
                if not data:
                    return b"".join(parts)
                parts.append(data)
        if self._left is None:
            return head + self._fp.read()
        data = self._exact(self._left)
        self._left = 0
        return head + data

    def readline(self) -> bytes:
        """The body's next line, with its newline (b"" at the end of the body)."""
        if not self._chunked:
            if self._left == 0:
                return b""
            line = self._fp.readline(-1 if self._left is None else self._left)
            if self._left is not None:
                self._left -= len(line)
            return line
        while True:
            i = self._pending.find(b"\n")
            if i >= 0:
                line = bytes(self._pending[: i + 1])
                del self._pending[: i + 1]
                return line
            data = self._chunk_bytes(_CHUNK_READ)
            if not data:
                line = bytes(self._pending)
                self._pending.clear()
                return line
            self._pending += data


class Connection:
    """A keep-alive connection to host:port; the caller reads each answer whole before the next
    request, as the client does."""

    def __init__(self, host: str, port: int, timeout: Optional[float] = None) -> None:
        self.host = host
        self.port = port
        self.timeout = timeout
        self.sock: Optional[socket.socket] = None
        self._reader = None  # type: ignore[var-annotated]
        self._method = "GET"

    def connect(self) -> None:
        self.sock = socket.create_connection((self.host, self.port), self.timeout)
        self.sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        self._reader = self.sock.makefile("rb")

    def close(self) -> None:
        if self._reader is not None:
            self._reader.close()
            self._reader = None
        if self.sock is not None:
            self.sock.close()
            self.sock = None

    def request(
        self,
        method: str,
        url: str,
        body: Optional[Union[bytes, bytearray, memoryview]] = None,
        headers: Mapping[str, str] = {},
    ) -> None:
        # As http.client: a target or field that would end its line early (a CR, LF or NUL: a
        # second request or header smuggled in) is refused before anything is sent.
        if _BAD_TARGET.search(url):
            raise http.client.InvalidURL(f"a request target with a space or control byte: {url!r}")
        for k, v in headers.items():
            if not k or _BAD_NAME.search(k) or _BAD_VALUE.search(str(v)):
                raise ValueError(f"an invalid header field: {k!r}: {v!r}")
        if self.sock is None:
            self.connect()
        host = self.host if ":" not in self.host else f"[{self.host}]"
        lines = [f"{method} {url} HTTP/1.1", f"Host: {host}:{self.port}"]
        lines += [f"{k}: {v}" for k, v in headers.items()]
        if body is not None or method in ("POST", "PUT", "PATCH"):
            lines.append(f"Content-Length: {len(body) if body is not None else 0}")
        head = ("\r\n".join(lines) + "\r\n\r\n").encode("latin-1")
        self._method = method
        assert self.sock is not None
        if not body:
            self.sock.sendall(head)
        elif hasattr(self.sock, "sendmsg"):
            # head and body in one write: the server reads them in one go, not woken twice
            parts = [memoryview(head), memoryview(body).cast("B")]
            while parts:
                n = self.sock.sendmsg(parts)
                while n > 0:
                    if n >= len(parts[0]):
                        n -= len(parts[0])
                        parts.pop(0)
                    else:
                        parts[0] = parts[0][n:]
                        n = 0
        else:
            self.sock.sendall(head + bytes(body))

    def getresponse(self) -> Response:
        if self._reader is None:
            raise http.client.NotConnected("no request was sent on this connection")
        return Response(self._reader, self._method)
