"""The Python client against a real attnd (preset tiny), plus two tiny fake servers for what a
healthy attnd cannot be made to do on demand (an error in the middle of a stream, a keep-alive
connection closed under the client).

The daemon comes from ATTND_BIN, else build/attnd under the repository root. Run from the
repository root: `make client-test`, or `PYTHONPATH=clients/python python3 -m unittest discover
-s clients/python/tests -t clients/python -v`.
"""

from __future__ import annotations

import base64
import http.server
import json
import os
import signal
import subprocess
import tempfile
import threading
import time
import unittest
from typing import List, Optional

import numpy as np

import attnd

REPO = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", "..", ".."))
HIDDEN, HEADS, KV_HEADS, HEAD_DIM = 64, 4, 2, 16  # preset tiny
TOL = 1e-5


def attnd_bin() -> str:
    path = os.environ.get("ATTND_BIN") or "build/attnd"
    if not os.path.isabs(path) and not os.path.exists(path):
        path = os.path.join(REPO, path)
    return path


class Daemon:
    """One attnd on a free port, its log in a temporary file (a pipe could fill and stall it)."""

    def __init__(self, *extra: str) -> None:
        self.log = tempfile.NamedTemporaryFile(prefix="attnd-client-test-", suffix=".log")
        args = [attnd_bin(), "--preset", "tiny", "--port", "0", "--host", "127.0.0.1", *extra]
        self.proc = subprocess.Popen(args, stdout=subprocess.DEVNULL, stderr=self.log)
        self.port = self._wait_port()
        self.url = f"http://127.0.0.1:{self.port}"

    def _read_log(self) -> str:
        with open(self.log.name, "rb") as f:
            return f.read().decode("utf-8", "replace")

    def _wait_port(self) -> int:
        end = time.monotonic() + 10
        while time.monotonic() < end:
            for line in self._read_log().splitlines():
                if " listening " in line and "port=" in line:
                    return int(line.split("port=", 1)[1].split()[0])
            if self.proc.poll() is not None:
                raise RuntimeError(f"attnd exited ({self.proc.returncode}): {self._read_log()}")
            time.sleep(0.02)
        self.proc.kill()
        raise RuntimeError("attnd did not start within 10 s")

    def stop(self) -> int:
        """SIGTERM (a clean drain exits 0) and the exit status."""
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self.log.close()
        return self.proc.returncode


DAEMON: Optional[Daemon] = None


def setUpModule() -> None:
    global DAEMON
    # f32 KV cache: the numpy references below compare at float precision, which the preset's
    # default bf16 cache would not reach (its rounding is the server's business, tested there).
    DAEMON = Daemon("--kv-dtype", "f32")


def tearDownModule() -> None:
    if DAEMON is not None:
        rc = DAEMON.stop()
        if rc != 0:
            raise AssertionError(f"attnd exited {rc} after SIGTERM (a crash, or a cut drain)")


def rng(seed: int) -> np.random.Generator:
    return np.random.default_rng(seed)


def xs(seed: int, t: int) -> np.ndarray:
    return rng(seed).standard_normal((t, HIDDEN)).astype(np.float32)


def ref_attention(q: np.ndarray, k: np.ndarray, v: np.ndarray, n_past: int):
    """Causal softmax attention in float64: q (H, T, d) at cache positions n_past.., over k, v
    (Hkv, n_past + T, d); query head h reads kv head h // (H / Hkv); scale 1/sqrt(d)."""
    h_n, t_n, d = q.shape
    group = h_n // k.shape[0]
    n = k.shape[1]
    out = np.zeros((h_n, t_n, v.shape[2]))
    w = np.zeros((h_n, t_n, n))
    for h in range(h_n):
        s = q[h].astype(np.float64) @ k[h // group].astype(np.float64).T / np.sqrt(d)
        for i in range(t_n):
            s[i, n_past + i + 1:] = -np.inf
        p = np.exp(s - s.max(axis=1, keepdims=True))
        p /= p.sum(axis=1, keepdims=True)
        w[h] = p
        out[h] = p @ v[h // group].astype(np.float64)
    return out, w


class ClientTest(unittest.TestCase):
    def setUp(self) -> None:
        self.c = attnd.Client(DAEMON.url)

    def tearDown(self) -> None:
        self.c.close()

    def sid(self, name: str) -> str:
        return f"{self.id().rsplit('.', 1)[-1]}.{name}"

    def test_server_endpoints(self) -> None:
        m = self.c.model()
        self.assertEqual((m["hidden_size"], m["num_attention_heads"], m["num_key_value_heads"],
                          m["head_dim"]), (HIDDEN, HEADS, KV_HEADS, HEAD_DIM))
        self.assertEqual(self.c.health(), {"status": "ok"})
        self.assertTrue(self.c.ready())
        self.c.session(self.sid("a")).attend(0, xs(1, 2))
        ids = [s["session_id"] for s in self.c.sessions()]
        self.assertIn(self.sid("a"), ids)
        self.assertEqual(self.c.pool()["dtype"], "f32")

    def test_session_prefill_decode_matches_stateless(self) -> None:
        x = xs(2, 9)
        whole = self.c.attend(0, x, weights=True)
        self.assertIsNone(whole.session_id)
        self.assertEqual((whole.n_past, whole.n_tokens), (0, 9))
        self.assertEqual(whole.output.shape, (9, HIDDEN))
        self.assertEqual(whole.weights.shape, (HEADS, 9, 9))
        s = self.c.session(self.sid("s"))
        r = s.attend(0, x[:6])
        outs = [r.output]
        self.assertEqual((r.n_past, r.n_tokens), (0, 6))
        for i in range(6, 9):
            r = s.attend(0, x[i], expect_n_past=i)  # (hidden,) is one token
            self.assertEqual((r.n_past, r.n_tokens, r.output.shape), (i, i + 1, (1, HIDDEN)))
            outs.append(r.output)
        np.testing.assert_allclose(np.concatenate(outs), whole.output, atol=TOL, rtol=0)
        # each layer has its own cache
        r1 = s.attend(1, x[:2])
        self.assertEqual((r1.layer, r1.n_past), (1, 0))
        layers = {l["layer"]: l["n_tokens"] for l in s.info()["layers"]}
        self.assertEqual(layers, {0: 9, 1: 2})

    def test_transports_bit_identical(self) -> None:
        x = xs(3, 5)
        q = rng(4).standard_normal((HEADS, 3, HEAD_DIM)).astype(np.float32)
        k = rng(5).standard_normal((KV_HEADS, 3, HEAD_DIM)).astype(np.float32)
        v = rng(6).standard_normal((KV_HEADS, 3, HEAD_DIM)).astype(np.float32)
        got = {}
        for t in ("binary", "base64", "json"):
            with attnd.Client(DAEMON.url, transport=t) as c:
                s = c.session(self.sid(t))
                a = c.attend(0, x, weights=True)
                p = s.attend(1, x[:4], weights=True)
                d = s.attend(1, x[4], weights=True, expect_n_past=4)
                b = c.attend_batch(0, [(self.sid(t + "b1"), x[:2], None, None, True),
                                       {"session_id": None, "x": x[2:4], "weights": True}])
                kv = c.session(self.sid(t + "kv")).kv_attend(0, q, k, v, weights=True)
                got[t] = [a.output, a.weights, p.output, p.weights, d.output, d.weights,
                          b[0].output, b[0].weights, b[1].output, b[1].weights,
                          kv.output, kv.weights]
        for t in ("base64", "json"):
            for i, (want, have) in enumerate(zip(got["binary"], got[t])):
                self.assertEqual(want.dtype, np.float32)
                self.assertTrue(np.array_equal(want, have), f"{t}: tensor {i} differs")

    def test_stream_equals_attend(self) -> None:
        x = xs(7, 7)
        plain = self.c.session(self.sid("plain"))
        plain.attend(0, x[:4])
        want = plain.attend(0, x[4:], weights=True)
        events = {}
        for t in ("binary", "json"):
            with attnd.Client(DAEMON.url, transport=t) as c:
                s = c.session(self.sid("stream-" + t))
                s.attend(0, x[:4])
                st = s.stream(0, x[4:], weights=True, expect_n_past=4)
                events[t] = list(st)
                self.assertEqual(st.usage.n_past, 4)
                self.assertEqual(st.usage.n_tokens, 7)
                self.assertEqual(st.usage.tokens, 3)
                self.assertEqual(s.info()["n_tokens"], 7)
        for t, evs in events.items():
            self.assertEqual([(e.index, e.position, e.n_past) for e in evs],
                             [(0, 4, 4), (1, 5, 5), (2, 6, 6)])
            for i, e in enumerate(evs):
                self.assertEqual(e.output.shape, (HIDDEN,))
                np.testing.assert_allclose(e.output, want.output[i], atol=TOL, rtol=0)
                self.assertEqual(e.weights.shape, (HEADS, 5 + i))
                np.testing.assert_allclose(e.weights, want.weights[:, i, :5 + i], atol=TOL, rtol=0)
        for a, b in zip(events["binary"], events["json"]):  # base64 events vs float events
            self.assertTrue(np.array_equal(a.output, b.output))
            self.assertTrue(np.array_equal(a.weights, b.weights))

    def test_stream_refused_before_first_step_raises_at_once(self) -> None:
        s = self.c.session(self.sid("s"))
        s.attend(0, xs(8, 2))
        with self.assertRaises(attnd.Conflict) as cm:
            s.stream(0, xs(8, 2), expect_n_past=5)
        self.assertEqual(cm.exception.code, "n_past_mismatch")

    def test_truncate_fork_delete_info(self) -> None:
        x = xs(9, 8)
        s = self.c.session(self.sid("s"))
        s.attend(0, x[:6])
        s.attend(1, x[:3])
        info = s.info()
        self.assertEqual(info["session_id"], s.id)
        self.assertEqual(info["n_tokens"], 6)
        t = s.truncate(4)
        self.assertEqual({l["layer"]: l["n_tokens"] for l in t["layers"]}, {0: 4, 1: 3})
        s.truncate(1, layer=1)
        self.assertEqual({l["layer"]: l["n_tokens"] for l in s.info()["layers"]}, {0: 4, 1: 1})
        # after the truncate, decoding continues as a session that only ever saw 4 tokens
        ref = self.c.session(self.sid("ref"))
        ref.attend(0, x[:4])
        want = ref.attend(0, x[6], expect_n_past=4)
        fork = s.fork(self.sid("fork"))
        self.assertEqual(fork.info()["n_tokens"], 4)
        got = s.attend(0, x[6], expect_n_past=4)
        got_fork = fork.attend(0, x[6], expect_n_past=4)
        np.testing.assert_allclose(got.output, want.output, atol=TOL, rtol=0)
        self.assertTrue(np.array_equal(got.output, got_fork.output))
        with self.assertRaises(attnd.Conflict) as cm:
            s.fork(fork.id)
        self.assertEqual(cm.exception.code, "session_exists")
        fork.delete()
        with self.assertRaises(attnd.NotFound):
            fork.info()
        with self.assertRaises(attnd.NotFound):
            fork.delete()
        # a deleted id starts afresh
        self.assertEqual(fork.attend(0, x[:2]).n_past, 0)

    def test_export_import_continues_identically(self) -> None:
        x = xs(10, 8)
        s = self.c.session(self.sid("src"))
        s.attend(0, x[:5])
        s.attend(1, x[:5])
        data = s.export()
        self.assertIsInstance(data, bytes)
        copy = self.c.import_session(self.sid("copy"), data)
        self.assertEqual(copy.info()["layers"], s.info()["layers"])
        for layer in (0, 1):
            a = s.attend(layer, x[5:7], weights=True, expect_n_past=5)
            b = copy.attend(layer, x[5:7], weights=True, expect_n_past=5)
            self.assertTrue(np.array_equal(a.output, b.output))
            self.assertTrue(np.array_equal(a.weights, b.weights))
        with self.assertRaises(attnd.Conflict) as cm:
            self.c.import_session(copy.id, data)
        self.assertEqual(cm.exception.code, "session_exists")
        broken = bytearray(data)
        broken[len(broken) // 2] ^= 0xFF
        with self.assertRaises(attnd.InvalidRequest) as cm:
            self.c.import_session(self.sid("broken"), bytes(broken))
        self.assertEqual(cm.exception.code, "corrupt_session")

    def test_attend_batch_with_a_failing_step(self) -> None:
        x = xs(11, 6)
        names = [self.sid(f"b{i}") for i in range(3)]
        for i, n in enumerate(names):
            self.c.session(n).attend(0, x[i:i + 3])
            self.c.session(n).fork(n + ".ref")
        res = self.c.attend_batch(0, [
            (names[0], x[3], 3),
            {"session_id": names[1], "x": x[4], "expect_n_past": 7},  # wrong: it holds 3
            {"session_id": names[2], "x": x[5:6], "expect_n_past": 3, "weights": True},
        ])
        self.assertEqual(len(res), 3)
        self.assertIsInstance(res[0], attnd.AttendResult)
        self.assertIsInstance(res[2], attnd.AttendResult)
        err = res[1]
        self.assertIsInstance(err, attnd.Conflict)
        self.assertIsInstance(err, attnd.AttndError)
        self.assertEqual((err.status, err.code, err.param),
                         (409, "n_past_mismatch", "expect_n_past"))
        self.assertEqual(self.c.session(names[1]).info()["n_tokens"], 3)  # unchanged
        self.assertIsNone(res[0].weights)
        self.assertEqual(res[2].weights.shape, (HEADS, 1, 4))
        for i in (0, 2):
            alone = self.c.session(names[i] + ".ref").attend(0, x[3 + i], weights=True)
            self.assertEqual((res[i].session_id, res[i].n_past, res[i].n_tokens), (names[i], 3, 4))
            np.testing.assert_allclose(res[i].output, alone.output, atol=TOL, rtol=0)
        # a malformed batch raises, and nothing ran
        with self.assertRaises(attnd.InvalidRequest) as cm:
            self.c.attend_batch(0, [(names[0], x[0]), (names[2], np.zeros((1, 3)))])
        self.assertEqual(cm.exception.param, "steps[1].x")
        self.assertEqual(self.c.session(names[0]).info()["n_tokens"], 4)

    def test_kv_attend_against_numpy(self) -> None:
        r = rng(12)
        t_total = 7
        q = r.standard_normal((HEADS, t_total, HEAD_DIM)).astype(np.float32)
        k = r.standard_normal((KV_HEADS, t_total, HEAD_DIM)).astype(np.float32)
        v = r.standard_normal((KV_HEADS, t_total, HEAD_DIM)).astype(np.float32)
        s = self.c.session(self.sid("kv"))
        chunks = [(0, 5), (5, 6), (6, 7)]  # a prefill, then two decode steps
        for a, b in chunks:
            qq = q[:, a:b] if b - a > 1 else q[:, a]  # (H, d) is one token
            res = s.kv_attend(1, qq, k[:, a:b], v[:, a:b], expect_n_past=a, weights=True)
            out, w = ref_attention(q[:, a:b], k[:, :b], v[:, :b], a)
            self.assertEqual((res.n_past, res.n_tokens), (a, b))
            self.assertEqual(res.output.shape, (HEADS, b - a, HEAD_DIM))
            np.testing.assert_allclose(res.output, out, atol=TOL, rtol=TOL)
            np.testing.assert_allclose(res.weights, w, atol=TOL, rtol=0)
        # batched q/k/v steps, one failing alone
        other = self.c.session(self.sid("kv2"))
        other.kv_attend(1, q[:, :2], k[:, :2], v[:, :2])
        res = self.c.kv_attend_batch(1, [
            (s.id, q[:, 6:7], k[:, 6:7], v[:, 6:7], 7),
            {"session_id": other.id, "q": q[:, 2], "k": k[:, 2], "v": v[:, 2],
             "expect_n_past": 0},
        ])
        self.assertIsInstance(res[1], attnd.Conflict)
        kk = np.concatenate([k, k[:, 6:7]], axis=1)
        vv = np.concatenate([v, v[:, 6:7]], axis=1)
        out, _ = ref_attention(q[:, 6:7], kk, vv, 7)
        np.testing.assert_allclose(res[0].output, out, atol=TOL, rtol=TOL)

    def test_typed_errors(self) -> None:
        with self.assertRaises(attnd.NotFound) as cm:
            self.c.session(self.sid("never")).info()
        e = cm.exception
        self.assertEqual((e.status, e.code), (404, "session_not_found"))
        self.assertTrue(e.request_id)
        s = self.c.session(self.sid("s"))
        with self.assertRaises(attnd.InvalidRequest) as cm:
            s.attend(0, np.zeros((2, HIDDEN + 1), np.float32))
        self.assertEqual((cm.exception.status, cm.exception.param), (400, "x"))
        with self.assertRaises(attnd.InvalidRequest) as cm:
            s.attend(9, xs(1, 1))
        self.assertEqual(cm.exception.param, "layer")
        s.attend(0, xs(13, 3))
        with self.assertRaises(attnd.Conflict) as cm:
            s.attend(0, xs(13, 1), expect_n_past=2)
        self.assertEqual((cm.exception.status, cm.exception.code, cm.exception.param),
                         (409, "n_past_mismatch", "expect_n_past"))
        self.assertEqual(s.info()["n_tokens"], 3)
        with self.assertRaises(ValueError):
            s.attend(0, np.full((1, HIDDEN), np.nan, np.float32))
        # the connection survives error answers
        self.assertEqual(s.attend(0, xs(13, 1), expect_n_past=3).n_tokens, 4)

    def test_api_key(self) -> None:
        d = Daemon("--api-key", "secret")
        try:
            with attnd.Client(d.url) as c:
                with self.assertRaises(attnd.Unauthorized) as cm:
                    c.model()
                self.assertEqual((cm.exception.status, cm.exception.code), (401, "unauthorized"))
                self.assertEqual(c.health()["status"], "ok")  # never behind the key
            with attnd.Client(d.url, api_key="wrong") as c:
                with self.assertRaises(attnd.Unauthorized):
                    c.session("k").attend(0, xs(1, 1))
            with attnd.Client(d.url, api_key="secret") as c:
                self.assertEqual(c.model()["hidden_size"], HIDDEN)
                self.assertEqual(c.session("k").attend(0, xs(1, 2)).n_tokens, 2)
                st = c.session("k").stream(0, xs(1, 1))
                self.assertEqual(len(list(st)), 1)
        finally:
            self.assertEqual(d.stop(), 0)


class FakeServer:
    """A stdlib HTTP/1.1 server answering with canned bytes, for failures attnd cannot be made to
    produce on demand."""

    def __init__(self, handler_body) -> None:
        class Handler(http.server.BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def do_POST(self) -> None:  # noqa: N802
                self.rfile.read(int(self.headers.get("Content-Length", "0")))
                handler_body(self)

            do_GET = do_POST  # noqa: N815

            def log_message(self, *args) -> None:
                pass

        self.server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self.thread.start()
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


class OfflineTest(unittest.TestCase):
    def test_stream_error_event_raises_typed(self) -> None:
        out = np.arange(HIDDEN, dtype=np.float32)
        first = {"index": 0, "position": 3, "n_past": 3,
                 "output": {"shape": [HIDDEN], "b64": base64.b64encode(out.tobytes()).decode()}}
        error = {"error": {"message": "the KV cache pool cannot hold this request",
                           "type": "insufficient_storage_error", "code": "kv_budget_exhausted",
                           "param": None}}

        def answer(h: http.server.BaseHTTPRequestHandler) -> None:
            body = (f"data: {json.dumps(first)}\n\ndata: {json.dumps(error)}\n\n"
                    "data: [DONE]\n\n").encode()
            h.send_response(200)
            h.send_header("Content-Type", "text/event-stream")
            h.send_header("Content-Length", str(len(body)))
            h.end_headers()
            h.wfile.write(body)

        srv = FakeServer(answer)
        try:
            with attnd.Client(srv.url) as c:
                st = c.session("s").stream(0, np.zeros((2, HIDDEN), np.float32))
                ev = next(st)
                self.assertEqual((ev.index, ev.position, ev.n_past), (0, 3, 3))
                self.assertTrue(np.array_equal(ev.output, out))
                with self.assertRaises(attnd.InsufficientStorage) as cm:
                    next(st)
                self.assertEqual((cm.exception.status, cm.exception.code),
                                 (507, "kv_budget_exhausted"))
        finally:
            srv.close()

    def test_reconnects_once_on_a_dropped_keepalive_connection(self) -> None:
        seen: List[int] = []

        def answer(h: http.server.BaseHTTPRequestHandler) -> None:
            seen.append(id(h.connection))
            body = b'{"status":"ok"}'
            h.send_response(200)
            h.send_header("Content-Type", "application/json")
            h.send_header("Content-Length", str(len(body)))
            h.end_headers()  # keep-alive promised...
            h.wfile.write(body)
            h.wfile.flush()
            h.close_connection = True  # ...and closed anyway, as an idle timeout does

        srv = FakeServer(answer)
        try:
            with attnd.Client(srv.url) as c:
                for _ in range(3):
                    time.sleep(0.05)  # let the server's close arrive first
                    self.assertEqual(c.health(), {"status": "ok"})
            self.assertEqual(len(seen), 3)
        finally:
            srv.close()

    def test_error_mapping(self) -> None:
        from attnd.errors import error_from_body
        cases = {
            ("session_evicted", 410): attnd.Gone, ("session_lost", 410): attnd.Gone,
            ("queue_full", 429): attnd.QueueFull, ("draining", 503): attnd.Unavailable,
            ("internal_error", 500): attnd.ServerError, ("payload_too_large", 413):
            attnd.PayloadTooLarge, ("fingerprint_mismatch", 409): attnd.Conflict,
            ("tokens_dropped", 409): attnd.Conflict, ("context_exists", 409): attnd.Conflict,
            ("not_found", 404): attnd.NotFound, ("replica_unavailable", 502): attnd.Unavailable,
            ("something_new", 409): attnd.Conflict, ("something_new", 599): attnd.ServerError,
        }
        for (code, status), cls in cases.items():
            e = error_from_body(status, {"error": {"message": "m", "code": code, "param": None}})
            self.assertIs(type(e), cls, code)
            self.assertEqual(e.status, status)
        # every code of proto/errors.json maps to its status's class
        with open(os.path.join(REPO, "proto", "errors.json")) as f:
            table = json.load(f)["errors"]
        for row in table:
            e = error_from_body(None, {"code": row["code"], "message": row["message"]})
            self.assertEqual(e.status, row["status"], row["code"])
            self.assertNotEqual(type(e), attnd.AttndError, row["code"])


if __name__ == "__main__":
    unittest.main()
