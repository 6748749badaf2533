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

    def test_negative_zero_identical_in_every_transport(self) -> None:
        # head_mask 0 on a head whose values are negative: its output rows are -0.0, which attnd
        # prints as "-0" in JSON; the sign bit must survive as it does in base64 and binary.
        q = np.ones((HEADS, 1, HEAD_DIM), np.float32)
        k = np.ones((KV_HEADS, 1, HEAD_DIM), np.float32)
        v = -np.ones((KV_HEADS, 1, HEAD_DIM), np.float32)
        got = {}
        for t in ("binary", "base64", "json"):
            with attnd.Client(DAEMON.url, transport=t) as c:
                r = c.session(self.sid(t)).kv_attend(0, q, k, v, head_mask=[1, 0, 1, 1])
                got[t] = r.output
        self.assertTrue(np.signbit(got["binary"][1]).all())
        for t in ("base64", "json"):
            self.assertTrue(np.array_equal(got["binary"].view(np.uint32), got[t].view(np.uint32)),
                            f"{t}: -0.0 lost its sign")

    def test_sdpa_against_numpy_in_every_transport(self) -> None:
        # POST /v1/sdpa: batched GQA with causal, window, scale and a key-padding mask (a bool
        # array), against numpy; the three transports bit for bit.
        r = rng(40)
        q = r.standard_normal((2, HEADS, 3, 8)).astype(np.float32)
        k = r.standard_normal((2, KV_HEADS, 6, 8)).astype(np.float32)
        v = r.standard_normal((2, KV_HEADS, 6, 5)).astype(np.float32)
        mask = np.ones((2, 1, 6), bool)
        mask[0, 0, 4] = mask[1, 0, 2] = False
        scale, window = 0.3, 2
        want = np.zeros((2, HEADS, 3, 5))
        for b in range(2):
            for h in range(HEADS):
                g = h // (HEADS // KV_HEADS)
                s = scale * q[b, h].astype(np.float64) @ k[b, g].astype(np.float64).T
                for i in range(3):
                    ii = i + 6 - 3
                    for j in range(6):
                        if j > ii or abs(ii - j) > window or not mask[b, 0, j]:
                            s[i, j] = -np.inf
                p = np.exp(s - s.max(axis=1, keepdims=True))
                want[b, h] = (p / p.sum(axis=1, keepdims=True)) @ v[b, g]
        got = {}
        for t in ("binary", "base64", "json"):
            with attnd.Client(DAEMON.url, transport=t) as c:
                a = c.sdpa(q, k, v, causal=True, window=window, scale=scale, mask=mask,
                           weights=True)
                self.assertEqual(a.output.shape, (2, HEADS, 3, 5))
                self.assertEqual(a.weights.shape, (2, HEADS, 3, 6))
                np.testing.assert_allclose(a.output, want, atol=TOL, rtol=0)
                lse = c.sdpa(q[0], k[0], v[0], weights=attnd.Selection(rows=[-1], kind="lse"))
                self.assertEqual(lse.lse.shape, (HEADS, 1))
                got[t] = [a.output, a.weights, lse.output, lse.lse]
                self.assertTrue(c.ready())  # the server is still up after a mask
        for t in ("base64", "json"):
            for i, (want_t, have) in enumerate(zip(got["binary"], got[t])):
                self.assertTrue(np.array_equal(want_t, have), f"{t}: tensor {i} differs")
        with self.assertRaises(ValueError):
            self.c.sdpa(q, k, v, kind="cosine")

    def test_key_mask_and_cross_attention(self) -> None:
        x, ctx = xs(41, 4), xs(42, 3)
        s = self.c.session(self.sid("s"))
        r = s.attend(0, x[:2], key_mask=[1, 0], weights=True)
        self.assertTrue(np.array_equal(r.weights[:, :, 1], np.zeros((HEADS, 2))))
        c1 = s.attend(0, x[2:], context=ctx)
        self.assertEqual((c1.context_tokens, c1.n_past, c1.n_tokens), (3, 2, 2))
        c2 = s.attend(0, x[2:], cross=True)
        self.assertEqual(c2.context_tokens, 3)
        self.assertTrue(np.array_equal(c1.output, c2.output))
        with self.assertRaises(attnd.Conflict) as cm:
            s.attend(0, x[2:], context=ctx[:2])
        self.assertEqual(cm.exception.code, "context_exists")
        self.assertEqual(s.attend(0, x[2:], context=ctx[:2], replace_context=True)
                         .context_tokens, 2)
        stateless = self.c.attend(0, x[2:], context=ctx)
        self.assertTrue(np.array_equal(stateless.output, c1.output))
        with self.assertRaises(ValueError):
            s.attend(0, x[:1], key_mask=[1, 2, 1])

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
        # a q/k/v step names its session and its three tensors, or is refused before sending
        for bad in ({"q": q[:, 2], "k": k[:, 2], "v": v[:, 2]}, {"session_id": other.id}):
            with self.assertRaisesRegex(TypeError, "needs"):
                self.c.kv_attend_batch(1, [bad])

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
        # arguments of the wrong kind fail here, never truncated into another layer or length
        for call in (lambda: s.attend(0.0, xs(13, 1)), lambda: s.attend(True, xs(13, 1)),
                     lambda: s.attend(0, xs(13, 1), expect_n_past=4.0),
                     lambda: s.attend(0, xs(13, 1), positions=[4.0]),
                     lambda: s.attend(0, xs(13, 1).astype(np.complex64)),
                     lambda: s.attend(0, None), lambda: s.truncate(2.0)):
            with self.assertRaises(TypeError):
                call()
        with self.assertRaises(ValueError):
            s.attend(0, xs(13, 1).astype(np.float64) * 1e39)  # beyond float32, though finite
        self.assertEqual(s.info()["n_tokens"], 4)

    def test_an_id_no_header_can_carry_is_a_typed_400(self) -> None:
        # Such an id went into X-Session-Id, where http.client raised UnicodeEncodeError or
        # ValueError mid-request and left the keep-alive connection so that the next, unrelated
        # call failed too (CannotSendRequest).
        for sid in ("\u65e5\u672c", "a\nb", "a b"):
            with self.assertRaises(attnd.InvalidRequest, msg=repr(sid)) as cm:
                self.c.session(sid).attend(0, xs(3, 1))
            self.assertEqual(cm.exception.param, "session_id")
            with self.assertRaises(attnd.InvalidRequest, msg=repr(sid)):
                self.c.session(sid).stream(0, xs(3, 1))
            self.assertEqual(self.c.health(), {"status": "ok"})
        with self.assertRaises(ValueError):
            self.c.session("s", route_key="a\nb")

    def test_payload_too_large_is_typed(self) -> None:
        # A body past --max-body-mb is answered 413 before it is read, and the connection closed
        # under the upload: the answer waits in the socket, not a broken connection.
        d = Daemon("--max-body-mb", "1")
        try:
            for transport in ("binary", "base64", "json"):
                with attnd.Client(d.url, transport=transport) as c:
                    for _ in range(2):  # also on a connection that served a request before
                        with self.assertRaises(attnd.PayloadTooLarge) as cm:
                            c.attend(0, np.zeros((20000, HIDDEN), np.float32))
                        self.assertEqual(cm.exception.status, 413)
                        self.assertEqual(c.health()["status"], "ok")
        finally:
            self.assertEqual(d.stop(), 0)

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


def causal_masked(n_past: int, t: int, n: int) -> np.ndarray:
    """(t, n) True where query row i of a call at n_past may not see key j (j > n_past + i)."""
    return np.arange(n)[None, :] > n_past + np.arange(t)[:, None]


class InspectTest(unittest.TestCase):
    """Selections, scores and LSE, capture, head_mask and the attention of cached tokens, against
    a daemon that keeps queries, with an f32 cache (so that cached attention equals the calls'
    own weights to float rounding)."""

    keep: Optional[Daemon] = None

    @classmethod
    def setUpClass(cls) -> None:
        cls.keep = Daemon("--keep-queries", "1", "--kv-dtype", "f32")

    @classmethod
    def tearDownClass(cls) -> None:
        if cls.keep is not None:
            rc = cls.keep.stop()
            if rc != 0:
                raise AssertionError(f"attnd --keep-queries 1 exited {rc} after SIGTERM")

    def setUp(self) -> None:
        self.c = attnd.Client(self.keep.url)

    def tearDown(self) -> None:
        self.c.close()

    def sid(self, name: str) -> str:
        return f"{self.id().rsplit('.', 1)[-1]}.{name}"

    def base(self, seed: int, t: int) -> attnd.Session:
        """A session holding t tokens of layer 0, to fork identical twins from."""
        s = self.c.session(self.sid(f"base{seed}"))
        s.attend(0, xs(seed, t))
        return s

    def test_selection_equals_cells_of_full_weights(self) -> None:
        x = xs(21, 9)
        base = self.base(21, 5)
        full = base.fork(self.sid("full")).attend(0, x[5:], weights=True, expect_n_past=5)
        w = full.weights
        self.assertEqual(w.shape, (HEADS, 4, 9))
        self.assertIsNone(full.selection)
        self.assertIsNone(full.scores)
        cases = [
            # (selection, its cells of w, the echo's heads, rows, keys)
            (attnd.Selection(heads=[0, -1], rows=[-1], keys=(2, None)),
             w[[0, 3]][:, [3], 2:], [0, 3], [3], [2, 9]),
            ({"heads": [2, 1, 2], "rows": np.array([2, 0])},  # a dict; sorted, repeats dropped
             w[[1, 2]][:, [0, 2], :], [1, 2], [0, 2], [0, 9]),
            (attnd.Selection(rows=1, keys=slice(None, -2), reduce="mean_heads"),
             w[:, [1], :7].mean(axis=0), [0, 1, 2, 3], [1], [0, 7]),
            (attnd.Selection(heads=range(1, 4), keys=range(-3, 0), reduce="max_heads"),
             w[1:4, :, 6:].max(axis=0), [1, 2, 3], [0, 1, 2, 3], [6, 9]),
            (attnd.Selection(), w, [0, 1, 2, 3], [0, 1, 2, 3], [0, 9]),
        ]
        for i, (sel, want, heads, rows, keys) in enumerate(cases):
            for t in ("binary", "json"):
                with attnd.Client(self.keep.url, transport=t) as c:
                    twin = c.session(base.id).fork(self.sid(f"sel{i}{t}"))
                    r = twin.attend(0, x[5:], weights=sel, expect_n_past=5)
                where = f"case {i}, {t}"
                reduce = sel.reduce if isinstance(sel, attnd.Selection) else "none"
                self.assertEqual(r.selection, {"kind": "probs", "reduce": reduce, "heads": heads,
                                               "rows": rows, "keys": keys}, where)
                self.assertEqual(r.weights.shape, want.shape, where)
                np.testing.assert_allclose(r.weights, want, atol=1e-6, rtol=0, err_msg=where)
                self.assertIsNone(r.scores, where)
                self.assertIsNone(r.lse, where)
                self.assertIsNone(r.capture, where)
                # a selection is read-only: the output and the cache are the plain call's
                np.testing.assert_allclose(r.output, full.output, atol=1e-6, rtol=0, err_msg=where)
                self.assertEqual(r.n_tokens, 9)

    def test_scores_and_lse_give_probs(self) -> None:
        x = xs(22, 8)
        base = self.base(22, 4)
        full = base.fork(self.sid("full")).attend(0, x[4:], weights=True)
        masked = causal_masked(4, 4, 8)
        got = {}
        for t in ("binary", "base64", "json"):
            with attnd.Client(self.keep.url, transport=t) as c:
                sc = c.session(base.id).fork(self.sid("s" + t)).attend(
                    0, x[4:], weights=attnd.Selection(kind="scores"))
                ls = c.session(base.id).fork(self.sid("l" + t)).attend(
                    0, x[4:], weights={"kind": "lse"})
            self.assertIsNone(sc.weights)
            self.assertEqual(sc.selection["kind"], "scores")
            self.assertEqual(sc.scores.dtype, np.float32)
            self.assertEqual(sc.scores.shape, (HEADS, 4, 8))
            self.assertEqual(ls.lse.shape, (HEADS, 4))
            # masked cells are -inf in every transport (JSON's null included), and only they are
            for h in range(HEADS):
                np.testing.assert_array_equal(np.isneginf(sc.scores[h]), masked, err_msg=t)
            self.assertTrue(np.isfinite(sc.scores[:, ~masked]).all())
            p = np.exp(sc.scores.astype(np.float64) - ls.lse[..., None])
            np.testing.assert_allclose(p, full.weights, atol=1e-5, rtol=0, err_msg=t)
            got[t] = (sc.scores, ls.lse)
        for t in ("base64", "json"):
            self.assertTrue(np.array_equal(got["binary"][0], got[t][0]), t)
            self.assertTrue(np.array_equal(got["binary"][1], got[t][1]), t)
        # reduced LSE: one value per row
        lse = got["binary"][1]
        for reduce, fn in (("mean_heads", np.mean), ("max_heads", np.max)):
            r = base.fork(self.sid(reduce)).attend(
                0, x[4:], weights=attnd.Selection(kind="lse", reduce=reduce, rows=[0, -1]))
            self.assertEqual(r.lse.shape, (2,))
            np.testing.assert_allclose(r.lse, fn(lse[:, [0, 3]], axis=0), atol=1e-5, rtol=0)

    def test_kv_attend_capture_and_scores_against_numpy(self) -> None:
        r = rng(23)
        q = r.standard_normal((HEADS, 6, HEAD_DIM)).astype(np.float32)
        k = r.standard_normal((KV_HEADS, 6, HEAD_DIM)).astype(np.float32)
        v = r.standard_normal((KV_HEADS, 6, HEAD_DIM)).astype(np.float32)
        s = self.c.session(self.sid("kv"))
        for a, b in ((0, 4), (4, 5), (5, 6)):
            res = s.kv_attend(0, q[:, a:b], k[:, a:b], v[:, a:b], expect_n_past=a,
                              capture=["q", "k", "v", "head_out"],
                              weights=attnd.Selection(kind="scores"))
            self.assertEqual(sorted(res.capture), ["head_out", "k", "q", "v"])
            # rope false: q, k and v come back exactly as sent
            for name, t in (("q", q), ("k", k), ("v", v)):
                self.assertEqual(res.capture[name].dtype, np.float32)
                self.assertTrue(np.array_equal(res.capture[name], t[:, a:b]), name)
            self.assertTrue(np.array_equal(res.capture["head_out"], res.output))
            out, _ = ref_attention(q[:, a:b], k[:, :b], v[:, :b], a)
            np.testing.assert_allclose(res.output, out, atol=TOL, rtol=TOL)
            group = HEADS // KV_HEADS
            want = np.stack([q[h, a:b].astype(np.float64) @ k[h // group, :b].T.astype(np.float64)
                             for h in range(HEADS)]) / np.sqrt(HEAD_DIM)
            want[:, causal_masked(a, b - a, b)] = -np.inf
            np.testing.assert_allclose(res.scores, want, atol=TOL, rtol=0)
        # capture alone: no weights of any kind
        res = self.c.session(self.sid("kv2")).kv_attend(0, q[:, 0], k[:, 0], v[:, 0],
                                                        capture="v")
        self.assertEqual(list(res.capture), ["v"])
        self.assertTrue(np.array_equal(res.capture["v"], v[:, :1]))
        self.assertIsNone(res.weights)
        self.assertIsNone(res.selection)

    def test_overflowed_row_is_nan_not_masked(self) -> None:
        # A score past float's range (|scale q.k| > 3.4e38) makes its row's lse and output NaN
        # (README: a selection's kind scores): base64 and binary carry that NaN, which must not
        # come back as the -inf of a row that sees no key.
        q = np.zeros((HEADS, 1, HEAD_DIM), np.float32)
        k = np.zeros((KV_HEADS, 1, HEAD_DIM), np.float32)
        v = np.ones((KV_HEADS, 1, HEAD_DIM), np.float32)
        q[0, 0, 0] = k[0, 0, 0] = 1e20
        # JSON writes both NaN and -inf as null: the client tells them apart by the row's output
        # (a row that sees no key has a finite one), so all three transports agree.
        for t in ("binary", "base64", "json"):
            with attnd.Client(self.keep.url, transport=t) as c:
                s = c.session(self.sid("ovf-" + t))
                r = s.kv_attend(0, q, k, v, weights=attnd.Selection(kind="lse", heads=[0, 1]))
                self.assertTrue(np.isnan(r.output[0]).all(), t)
                self.assertTrue(np.isnan(r.lse[0, 0]), "%s: %r" % (t, r.lse))
                self.assertTrue(np.isfinite(r.lse[1, 0]), t)
                r = c.sdpa(q[None], k[None], v[None],
                           weights=attnd.Selection(kind="lse", reduce="max_heads"))
                self.assertTrue(np.isnan(r.lse[0, 0]), "%s: %r" % (t, r.lse))
                r = c.attend(0, xs(31, 2), key_mask=[0, 1], weights=attnd.Selection(kind="lse"))
                self.assertTrue(np.isneginf(r.lse[:, 0]).all(), "%s: %r" % (t, r.lse))
                self.assertTrue(np.isfinite(r.lse[:, 1]).all(), "%s: %r" % (t, r.lse))
        # The same row recomputed from the cache (GET .../attention, always JSON, whose nulls
        # the client reads): its lse NaN and its own key's score +inf, not the -inf of a row that
        # sees no key; the key after it, appended by a second token, is masked (-inf).
        s.kv_attend(0, q * 0, k * 0, v)
        a = s.attention(layer=0, kind="lse")
        self.assertTrue(np.isnan(a.lse[0, 0]), repr(a.lse))
        self.assertTrue(np.isfinite(a.lse[1:]).all(), repr(a.lse))
        a = s.attention(layer=0, kind="scores")
        self.assertEqual((a.scores[0, 0, 0], a.scores[0, 0, 1]), (np.inf, -np.inf))
        self.assertTrue(np.isfinite(a.scores[0, 1]).all() and np.isfinite(a.scores[1:, 1]).all())

    def test_head_mask_scales_each_head(self) -> None:
        r = rng(24)
        q = r.standard_normal((HEADS, 5, HEAD_DIM)).astype(np.float32)
        k = r.standard_normal((KV_HEADS, 5, HEAD_DIM)).astype(np.float32)
        v = r.standard_normal((KV_HEADS, 5, HEAD_DIM)).astype(np.float32)
        masked = self.c.session(self.sid("masked"))
        masked.kv_attend(0, q[:, :3], k[:, :3], v[:, :3])
        plain = masked.fork(self.sid("plain"))
        mask = np.array([1.0, 0.0, 0.5, -2.0], np.float32)
        m = masked.kv_attend(0, q[:, 3], k[:, 3], v[:, 3], head_mask=mask, capture=["head_out"])
        u = plain.kv_attend(0, q[:, 3], k[:, 3], v[:, 3])
        self.assertTrue(np.array_equal(m.capture["head_out"], u.output))  # before the mask
        np.testing.assert_allclose(m.output, u.output * mask[:, None, None], atol=1e-7, rtol=0)
        self.assertTrue(np.all(m.output[1] == 0))
        self.assertFalse(np.allclose(m.output[3], u.output[3]))
        # for that request only: the next step of both is the same
        a = masked.kv_attend(0, q[:, 4], k[:, 4], v[:, 4], expect_n_past=4)
        b = plain.kv_attend(0, q[:, 4], k[:, 4], v[:, 4], expect_n_past=4)
        self.assertTrue(np.array_equal(a.output, b.output))
        # through o_proj (stateless /v1/attend), the output is linear in the mask
        x = xs(24, 3)
        out = {tuple(mk): self.c.attend(0, x, head_mask=mk).output
               for mk in ([1, 1, 1, 1], [0, 0, 0, 0], [1, 0, 1, 0], [0, 1, 0, 1])}
        np.testing.assert_allclose(out[(1, 1, 1, 1)], self.c.attend(0, x).output, atol=1e-6,
                                   rtol=0)
        np.testing.assert_allclose(out[(1, 1, 1, 1)] + out[(0, 0, 0, 0)],
                                   out[(1, 0, 1, 0)] + out[(0, 1, 0, 1)], atol=1e-5, rtol=0)
        self.assertGreater(np.abs(out[(1, 0, 1, 0)] - out[(1, 1, 1, 1)]).max(), 1e-3)
        with self.assertRaises(attnd.InvalidRequest) as cm:
            self.c.attend(0, x, head_mask=[1, 1])
        self.assertEqual(cm.exception.param, "head_mask")

    def test_batch_steps_inspect(self) -> None:
        x = xs(25, 6)
        names = [self.sid(f"b{i}") for i in range(2)]
        for i, n in enumerate(names):
            self.c.session(n).attend(0, x[i:i + 3])
            self.c.session(n).fork(n + ".ref")
        sel = {"heads": [-1], "rows": [-1], "kind": "scores"}
        res = self.c.attend_batch(0, [
            (names[0], x[3:5], 3, None, sel, ["q"], [1, 1, 0, 1]),
            {"session_id": names[1], "x": x[5], "weights": True, "capture": ["head_out"]},
        ])
        a = self.c.session(names[0] + ".ref").attend(0, x[3:5], weights=sel, capture=["q"],
                                                      head_mask=[1, 1, 0, 1])
        b = self.c.session(names[1] + ".ref").attend(0, x[5], weights=True, capture="head_out")
        for got, want in ((res[0], a), (res[1], b)):
            self.assertIsInstance(got, attnd.AttendResult)
            self.assertEqual(got.selection, want.selection)
            self.assertEqual(sorted(got.capture), sorted(want.capture))
            for name in got.capture:
                np.testing.assert_allclose(got.capture[name], want.capture[name], atol=TOL,
                                           rtol=0)
            np.testing.assert_allclose(got.output, want.output, atol=TOL, rtol=0)
        self.assertEqual(res[0].scores.shape, (1, 1, 5))
        np.testing.assert_allclose(res[0].scores, a.scores, atol=TOL, rtol=0)
        np.testing.assert_allclose(res[1].weights, b.weights, atol=TOL, rtol=0)
        # q/k/v steps
        r = rng(25)
        q = r.standard_normal((HEADS, 2, HEAD_DIM)).astype(np.float32)
        k = r.standard_normal((KV_HEADS, 2, HEAD_DIM)).astype(np.float32)
        v = r.standard_normal((KV_HEADS, 2, HEAD_DIM)).astype(np.float32)
        res = self.c.kv_attend_batch(0, [
            {"session_id": self.sid("kv"), "q": q, "k": k, "v": v, "capture": ["k", "head_out"],
             "head_mask": [0, 1, 1, 1], "weights": attnd.Selection(kind="lse")},
        ])
        self.assertTrue(np.array_equal(res[0].capture["k"], k))
        self.assertTrue(np.array_equal(res[0].output[0], np.zeros((2, HEAD_DIM), np.float32)))
        self.assertTrue(np.array_equal(res[0].output[1:], res[0].capture["head_out"][1:]))
        self.assertEqual(res[0].lse.shape, (HEADS, 2))

    def test_cached_attention_equals_the_calls_weights(self) -> None:
        x = xs(26, 8)
        s = self.c.session(self.sid("s"))
        s.attend(0, x[:2])
        full = np.zeros((HEADS, 8, 8))
        for a, b in ((0, 4), (4, 5), (5, 6), (6, 8)):  # a prefill, decode steps, two tokens
            r = s.attend(1, x[a:b] if b - a > 1 else x[a], weights=True, expect_n_past=a)
            full[:, a:b, :b] = r.weights
        c = s.attention(layer=1)
        self.assertIsInstance(c, attnd.CachedAttention)
        self.assertEqual((c.session_id, c.layer, c.n_tokens, c.first_row, c.kind, c.reduce),
                         (s.id, 1, 8, 0, "probs", "none"))
        self.assertEqual((c.heads, c.rows, c.keys), ([0, 1, 2, 3], list(range(8)), [0, 8]))
        self.assertEqual(c.weights.shape, (HEADS, 8, 8))
        self.assertIs(c.values, c.weights)
        np.testing.assert_allclose(c.weights, full, atol=1e-5, rtol=0)
        # selections: python ints, lists, slices, ranges and the server's text
        c = s.attention(layer=1, heads=[0, slice(2, 4)], rows=slice(-3, None), keys=(2, None))
        self.assertEqual((c.heads, c.rows, c.keys), ([0, 2, 3], [5, 6, 7], [2, 8]))
        np.testing.assert_allclose(c.weights, full[[0, 2, 3]][:, 5:, 2:], atol=1e-5, rtol=0)
        c = s.attention(1, heads="1:3", rows=[0, range(3, 5)], keys=range(0, 6))
        self.assertEqual((c.heads, c.rows, c.keys), ([1, 2], [0, 3, 4], [0, 6]))
        np.testing.assert_allclose(c.weights, full[1:3][:, [0, 3, 4], :6], atol=1e-5, rtol=0)
        c = s.attention(1, heads=-1, rows=range(-2, 0), reduce="mean_heads")
        self.assertEqual((c.heads, c.rows, c.reduce), ([3], [6, 7], "mean_heads"))
        np.testing.assert_allclose(c.weights, full[3, 6:], atol=1e-5, rtol=0)
        c = s.attention(1, rows="4", reduce="max_heads")
        np.testing.assert_allclose(c.weights, full[:, 4:5].max(axis=0), atol=1e-5, rtol=0)
        # scores and LSE of cached tokens: masked -inf, probs = exp(scores - lse)
        sc = s.attention(1, kind="scores")
        ls = s.attention(1, kind="lse")
        self.assertIsNone(sc.weights)
        self.assertIs(sc.values, sc.scores)
        self.assertEqual(ls.lse.shape, (HEADS, 8))
        for h in range(HEADS):
            np.testing.assert_array_equal(np.isneginf(sc.scores[h]), causal_masked(0, 8, 8))
        np.testing.assert_allclose(np.exp(sc.scores.astype(np.float64) - ls.lse[..., None]), full,
                                   atol=1e-5, rtol=0)
        # an empty key range keeps its shape, and the default layer is the first
        c = s.attention(heads=0, rows=[0, 1], keys="1:1")
        self.assertEqual((c.layer, c.n_tokens, c.keys, c.weights.shape), (0, 2, [1, 1], (1, 2, 0)))
        # a layer this session never used: no rows (JSON's [[], ...] keeps all three axes)
        e = self.c.session(self.sid("one-layer"))
        e.attend(0, x[:2])
        c = e.attention(layer=1)
        self.assertEqual((c.n_tokens, c.rows, c.keys, c.weights.shape),
                         (0, [], [0, 0], (HEADS, 0, 0)))
        self.assertEqual(e.attention(layer=1, kind="lse").lse.shape, (HEADS, 0))
        # what attention() reads is what the server was asked
        with self.assertRaises(attnd.InvalidRequest) as cm:
            s.attention(1, rows="8:")
        self.assertEqual(cm.exception.param, "rows")
        with self.assertRaises(attnd.NotFound):
            self.c.session(self.sid("never")).attention()

    def test_attention_without_kept_queries_is_a_typed_conflict(self) -> None:
        with attnd.Client(DAEMON.url) as c:
            s = c.session(self.sid("s"))
            s.attend(0, xs(27, 2))
            with self.assertRaises(attnd.Conflict) as cm:
                s.attention(rows=[-1])
            e = cm.exception
            self.assertEqual((e.status, e.code), (409, "queries_not_kept"))
            self.assertIs(type(e), attnd.Conflict)
            # the connection, and the session, survive it
            self.assertEqual(s.attend(0, xs(27, 1), expect_n_past=2).n_tokens, 3)


class FakeServer:
    """A stdlib HTTP/1.1 server answering with canned bytes, for failures attnd cannot be made to
    produce on demand."""

    def __init__(self, handler_body) -> None:
        class Handler(http.server.BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def do_POST(self) -> None:  # noqa: N802
                self.rfile.read(int(self.headers.get("Content-Length", "0")))
                handler_body(self)

            do_GET = do_PUT = do_DELETE = do_POST  # noqa: N815

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


    def test_attention_query_and_json_nulls(self) -> None:
        # what Session.attention puts in the query string, and a JSON answer's nulls (masked
        # scores) read back as -inf
        paths: List[str] = []
        answer_doc = {"session_id": "s/1", "layer": 1, "n_tokens": 3, "first_row": 0,
                      "kind": "scores", "reduce": "none", "heads": [0, 2], "rows": [1, 2],
                      "keys": [0, 3],
                      "scores": [[[0.5, -1.0, None], [0.25, 0.0, 1.5]],
                                 [[2.0, 0.125, None], [-0.5, 0.75, -2.0]]]}

        def answer(h: http.server.BaseHTTPRequestHandler) -> None:
            paths.append(h.path)
            body = json.dumps(answer_doc).encode()
            h.send_response(200)
            h.send_header("Content-Type", "application/json")
            h.send_header("Content-Length", str(len(body)))
            h.end_headers()
            h.wfile.write(body)

        srv = FakeServer(answer)
        try:
            with attnd.Client(srv.url) as c:
                s = c.session("s/1")
                got = s.attention(layer=1, heads=[0, slice(6, 8), range(2, 4)],
                                  rows=slice(-5, None), keys=(2, None), kind="scores")
                self.assertEqual(got.scores.dtype, np.float32)
                self.assertEqual(got.scores.shape, (2, 2, 3))
                self.assertEqual(got.scores[0, 0, 2], -np.inf)
                self.assertEqual(got.scores[1, 0, 2], -np.inf)
                self.assertEqual(int(np.isneginf(got.scores).sum()), 2)
                self.assertEqual(got.scores[1, 1, 2], -2.0)
                self.assertIs(got.values, got.scores)
                self.assertIsNone(got.weights)
                s.attention()
                s.attention(heads=range(-2, 0), rows=[3, range(0, 7, 3)], keys=slice(None, -1),
                            reduce="max_heads")
                s.attention(heads="all", rows=range(-3, 1), keys=range(-4, 0))
                s.attention(heads=np.array([1, 3]), rows=-1, keys="1:")
                for bad in ([], range(0), [1.5], b"0"):
                    with self.assertRaises((TypeError, ValueError)):
                        s.attention(heads=bad)
                with self.assertRaises(TypeError):
                    s.attention(keys=3)
                with self.assertRaises(ValueError):
                    s.attention(rows=slice(0, 8, 2))
                with self.assertRaises(ValueError):
                    s.attention(kind="prob")
        finally:
            srv.close()
        self.assertEqual(paths, [
            "/v1/sessions/s%2F1/attention?layer=1&heads=0,6:8,2:4&rows=-5:&keys=2:&kind=scores",
            "/v1/sessions/s%2F1/attention",
            "/v1/sessions/s%2F1/attention?heads=-2:&rows=3,0,3,6&keys=:-1&reduce=max_heads",
            "/v1/sessions/s%2F1/attention?heads=all&rows=-3,-2,-1,0&keys=-4:",
            "/v1/sessions/s%2F1/attention?heads=1,3&rows=-1&keys=1:",
        ])

    def test_inspection_arguments(self) -> None:
        # the request fields the inspection arguments become, checked before anything is sent
        from attnd.client import _inspect
        body: dict = {}
        _inspect(body, attnd.Selection(heads=np.int64(2), rows=range(1, 3), keys=slice(-4, None),
                                       kind="lse", reduce="mean_heads"),
                 ("head_out", "q", "q"), np.array([1, 0.5, 0, 2], np.float64))
        self.assertEqual(body, {
            "return_weights": {"heads": [2], "rows": [1, 2], "keys": [-4, None], "kind": "lse",
                               "reduce": "mean_heads"},
            "capture": ["head_out", "q"], "head_mask": [1.0, 0.5, 0.0, 2.0]})
        json.dumps(body, allow_nan=False)  # plain JSON: no numpy scalars, no tensors
        for w, want in ((True, {"return_weights": True}), (False, {}), (None, {}),
                        ({}, {"return_weights": {}}),
                        ({"rows": [-1], "keys": [0, None]},
                         {"return_weights": {"rows": [-1], "keys": [0, None]}})):
            body = {}
            _inspect(body, w, None, None)
            self.assertEqual(body, want, w)
        for w, exc in (({"head": [0]}, TypeError), ({"kind": "prob"}, ValueError),
                       ({"reduce": "sum"}, ValueError), ([0, 1], TypeError),
                       ({"heads": slice(0, 2)}, TypeError), ({"keys": [0, 1, 2]}, ValueError),
                       ({"keys": slice(0, 8, 2)}, ValueError), ({"rows": [0.5]}, TypeError)):
            with self.assertRaises(exc, msg=repr(w)):
                _inspect({}, w, None, None)
        with self.assertRaises(ValueError):
            _inspect({}, False, ["x"], None)
        with self.assertRaises(ValueError):
            _inspect({}, False, None, [1, np.nan, 1, 1])
        # A vector argument of two dims past 1 is refused, not read row after row: (2, 2) is not
        # the 4 heads of a 4-head model (nor (layers, heads), (batch, T) one list); a batch of
        # one or a column is its n values.
        from attnd.client import _key_mask, _positions
        for bad in (lambda: _inspect({}, False, None, [[1, 1], [0, 1]]),
                    lambda: _positions(np.arange(6).reshape(2, 3)),
                    lambda: _key_mask(np.ones((2, 2), bool))):
            with self.assertRaises(ValueError):
                bad()
        body = {}
        _inspect(body, False, None, np.array([[1], [0], [1], [1]]))
        self.assertEqual(body, {"head_mask": [1.0, 0.0, 1.0, 1.0]})
        self.assertEqual(_positions(np.arange(3)[None, :]), [0, 1, 2])
        self.assertEqual(_key_mask([[1, 0, 1]]), [1, 0, 1])
        with attnd.Client("http://127.0.0.1:9") as c:  # nothing listens: refused before sending
            with self.assertRaises(TypeError):
                c.session("s").stream(0, np.zeros((1, HIDDEN)), weights=attnd.Selection())
            # a flag is a bool: causal="false" was sent as causal true
            qkv = np.zeros((1, 2, 4), np.float32)
            for call in (lambda: c.sdpa(qkv, qkv, qkv, causal="false"),
                         lambda: c.sdpa(qkv, qkv, qkv, causal=None),
                         lambda: c.session("s").kv_attend(0, qkv, qkv, qkv, rope="no"),
                         lambda: c.session("s").attend(0, np.zeros(HIDDEN), cross="yes"),
                         lambda: c.kv_attend_batch(0, [("s", qkv, qkv, qkv)], rope=2)):
                with self.assertRaises(TypeError):
                    call()

    def test_cached_attention_nulls_on_a_sliding_layer(self) -> None:
        # A cached score's null is -inf where the key is after the row or outside the layer's
        # window (GET /v1/model's attnd.layers[].sliding_window: W keys with the row's own), and
        # +inf (a score past float's range) where the row sees the key.
        docs = {
            "/v1/model": {"attnd": {"layers": [{"layer": 1, "sliding_window": 2}]}},
            "/v1/sessions/s/attention": {
                "session_id": "s", "layer": 1, "n_tokens": 3, "first_row": 0, "kind": "scores",
                "reduce": "none", "heads": [0], "rows": [0, 1, 2], "keys": [0, 3],
                "scores": [[[None, None, None], [0.5, None, None], [None, None, 0.25]]]},
        }

        def answer(h: http.server.BaseHTTPRequestHandler) -> None:
            body = json.dumps(docs[h.path.split("?")[0]]).encode()
            h.send_response(200)
            h.send_header("Content-Type", "application/json")
            h.send_header("Content-Length", str(len(body)))
            h.end_headers()
            h.wfile.write(body)

        srv = FakeServer(answer)
        try:
            with attnd.Client(srv.url) as c:
                a = c.session("s").attention(layer=1, kind="scores")
        finally:
            srv.close()
        inf = np.inf
        self.assertTrue(np.array_equal(a.scores, np.array(
            [[[inf, -inf, -inf], [0.5, inf, -inf], [-inf, inf, 0.25]]], np.float32)), a.scores)

    def test_fork_copy_routes_by_its_source(self) -> None:
        # Behind docker/'s proxy a fork's copy lives on its source's replica, reached only with
        # X-Route-Key naming the source; without it the copy's calls went by its own id to another
        # replica, where an attend silently started an empty cache.
        seen: List[tuple] = []

        def answer(h: http.server.BaseHTTPRequestHandler) -> None:
            seen.append((h.command, h.path.split("?")[0], h.headers.get("X-Route-Key")))
            ok = h.path.endswith("/fork")
            body = b"{}" if ok else json.dumps({"error": {
                "message": "no such session", "type": "not_found_error",
                "code": "session_not_found", "param": "session_id"}}).encode()
            h.send_response(200 if ok else 404)
            h.send_header("Content-Type", "application/json")
            h.send_header("Content-Length", str(len(body)))
            h.end_headers()
            h.wfile.write(body)

        srv = FakeServer(answer)
        x = np.zeros((1, HIDDEN), np.float32)
        qkv = np.zeros((HEADS, 1, HEAD_DIM), np.float32)
        try:
            with attnd.Client(srv.url) as c:
                src = c.session("src")
                beam = src.fork("beam")
                self.assertEqual(beam.route_key, "src")
                grand = beam.fork("beam.2")  # a copy of a copy: still on the first source's
                self.assertEqual(grand.route_key, "src")
                del seen[:]
                calls = [lambda: beam.attend(0, x), lambda: beam.kv_attend(0, qkv, qkv, qkv),
                         lambda: beam.stream(0, x), beam.info, beam.attention,
                         lambda: beam.truncate(0), beam.export, beam.delete,
                         lambda: c.import_session("moved", b"file", route_key="src")]
                for call in calls:
                    with self.assertRaises(attnd.NotFound):
                        call()
                with self.assertRaises(attnd.NotFound):
                    src.info()
        finally:
            srv.close()
        self.assertEqual(len(seen), len(calls) + 1)
        for method, path, route in seen[:-1]:
            self.assertEqual(route, "src", f"{method} {path}")
        self.assertEqual(seen[-1], ("GET", "/v1/sessions/src", None))


if __name__ == "__main__":
    unittest.main()
