"""The client's own HTTP/1.1 connection (attnd/_http.py) against a raw-socket fake server that
answers with each framing a server or a proxy may use: Content-Length, chunks (with extensions
and a trailer, lines split across chunks), a body that runs to the close, an interim 100, repeated
fields, and the failures the client's retry rules tell apart."""

from __future__ import annotations

import http.client
import socket
import threading
import unittest
from typing import List, Tuple

from attnd import _http


class FakeServer:
    """Accepts one connection; for each request read (head, then Content-Length bytes), sends the
    next canned answer's bytes as given, or closes when the answer is None."""

    def __init__(self, answers: List[object]) -> None:
        self.answers = list(answers)
        self.requests: List[Tuple[bytes, bytes]] = []
        self.sock = socket.socket()
        self.sock.bind(("127.0.0.1", 0))
        self.sock.listen(1)
        self.port = self.sock.getsockname()[1]
        self.thread = threading.Thread(target=self.serve, daemon=True)
        self.thread.start()

    def serve(self) -> None:
        conn, _ = self.sock.accept()
        f = conn.makefile("rb")
        try:
            for answer in self.answers:
                head = b""
                while not head.endswith(b"\r\n\r\n"):
                    line = f.readline()
                    if not line:
                        return
                    head += line
                length = 0
                for line in head.split(b"\r\n"):
                    if line.lower().startswith(b"content-length:"):
                        length = int(line.split(b":", 1)[1])
                self.requests.append((head, f.read(length)))
                if answer is None:
                    break
                conn.sendall(answer)  # type: ignore[arg-type]
        finally:
            f.close()
            conn.close()
            self.sock.close()

    def connect(self) -> _http.Connection:
        return _http.Connection("127.0.0.1", self.port, timeout=10)


def exchange(conn: _http.Connection, method: str = "POST", body: bytes = b"x") -> _http.Response:
    conn.request(method, "/v1/attend", body=body, headers={"Content-Type": "text/plain"})
    return conn.getresponse()


class HttpTest(unittest.TestCase):
    def test_content_length_answers_on_one_connection(self) -> None:
        body = bytes(range(256)) * 300  # past a socket read
        srv = FakeServer(
            [
                b"HTTP/1.1 200 OK\r\nContent-Length: %d\r\nX-Request-Id: 7\r\n\r\n" % len(body)
                + body,
                b"HTTP/1.1 201 Created\r\ncontent-length: 2\r\n\r\nok",
            ]
        )
        conn = srv.connect()
        r = exchange(conn, body=b"\x00" * 70000)
        self.assertEqual((r.status, r.headers.get("x-request-id")), (200, "7"))
        self.assertEqual(r.headers.get("X-REQUEST-ID"), "7")
        self.assertFalse(r.will_close)
        self.assertEqual(r.read(), body)
        r = exchange(conn, "GET", None)  # type: ignore[arg-type]
        self.assertEqual((r.status, r.read()), (201, b"ok"))
        conn.close()
        srv.thread.join(5)
        head, sent = srv.requests[0]
        self.assertTrue(head.startswith(b"POST /v1/attend HTTP/1.1\r\n"), head)
        self.assertIn(b"\r\nContent-Length: 70000\r\n", head)
        self.assertIn(b"\r\nContent-Type: text/plain\r\n", head)
        self.assertIn(b"\r\nHost: 127.0.0.1:%d\r\n" % srv.port, head)
        self.assertEqual(sent, b"\x00" * 70000)
        self.assertNotIn(b"Content-Length", srv.requests[1][0])  # a GET without a body

    def test_chunks_with_extensions_trailer_and_split_lines(self) -> None:
        srv = FakeServer(
            [
                b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n"
                b"5;ext=1\r\ndata:\r\n3\r\n 1\n\r\n7\r\n\ndata: \r\n4\r\n2\n\n:\r\n0\r\nX-Trailer: t\r\n"
                b"\r\n",
                b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n3\r\nabc\r\n2\r\nde\r\n0\r\n\r\n",
            ]
        )
        conn = srv.connect()
        r = exchange(conn)
        lines = []
        while True:
            line = r.readline()
            if not line:
                break
            lines.append(line)
        self.assertEqual(lines, [b"data: 1\n", b"\n", b"data: 2\n", b"\n", b":"])
        r = exchange(conn)  # the trailer was read whole: the connection is in step
        self.assertEqual(r.read(), b"abcde")
        conn.close()

    def test_body_to_the_close_and_interim_answer(self) -> None:
        srv = FakeServer([b"HTTP/1.1 100 Continue\r\n\r\nHTTP/1.0 200 OK\r\n\r\nall of it"])
        conn = srv.connect()
        r = exchange(conn)
        self.assertEqual(r.status, 200)
        self.assertTrue(r.will_close)
        self.assertEqual(r.read(), b"all of it")
        conn.close()

    def test_repeated_fields_join_and_close_is_seen(self) -> None:
        srv = FakeServer(
            [b"HTTP/1.1 204 No Content\r\nVary: a\r\nVary: b\r\nConnection: close\r\n\r\n"]
        )
        conn = srv.connect()
        r = exchange(conn)
        self.assertEqual((r.status, r.headers.get("vary"), r.read()), (204, "a, b", b""))
        self.assertTrue(r.will_close)
        conn.close()

    def test_failures_raise_what_http_client_raises(self) -> None:
        srv = FakeServer([None])  # closes without answering: a stale keep-alive connection
        conn = srv.connect()
        with self.assertRaises(http.client.RemoteDisconnected):
            exchange(conn)
        conn.close()
        for bad in (
            b"HTTP/1.1 abc OK\r\n\r\n",
            b"ICY 200 OK\r\n\r\n",
            b"HTTP/1.1 200 OK\r\nno colon here\r\n\r\n",
            b"HTTP/1.1 200 OK\r\nContent-Length: -1\r\n\r\n",
            b"HTTP/1.1 200 OK\r\nContent-Length: x\r\n\r\n",
        ):
            srv = FakeServer([bad])
            conn = srv.connect()
            with self.assertRaises(http.client.HTTPException, msg=bad):
                exchange(conn)
            conn.close()
        for size in (b"-1", b"0x10", b"1_0", b"+5", b""):
            srv = FakeServer(
                [b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n" + size + b"\r\nabcde"]
            )
            conn = srv.connect()
            r = exchange(conn)
            with self.assertRaises(http.client.HTTPException, msg=size):
                r.read()
            conn.close()
        srv = FakeServer([b"HTTP/1.1 200 OK\r\nContent-Length: 10\r\n\r\nshort"])
        conn = srv.connect()
        r = exchange(conn)
        srv.thread.join(5)  # the server closed after 5 of the 10 bytes
        with self.assertRaises(http.client.IncompleteRead):
            r.read()
        conn.close()
        conn = _http.Connection("127.0.0.1", 9, timeout=1)  # refused before any connection
        with self.assertRaises(http.client.InvalidURL):
            conn.request("GET", "/v1/sessions/a\r\nX-Evil: 1")
        for name, value in (("X-Session-Id", "a\nb"), ("X-A\r\nB", "c"), ("X-Id", "a\0")):
            with self.assertRaises(ValueError):
                conn.request("GET", "/v1/model", headers={name: value})
        self.assertIsNone(conn.sock)
        srv = FakeServer([b"HTTP/1.1 200 OK\r\n" + b"X: y\r\n" * 101 + b"\r\n"])
        conn = srv.connect()
        with self.assertRaises(http.client.HTTPException):
            exchange(conn)
        conn.close()


if __name__ == "__main__":
    unittest.main()
