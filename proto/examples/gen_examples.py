#!/usr/bin/python3
"""proto/examples/gen_examples.py: writes the example request files and the /v1/sdpa golden
responses, computed here in numpy (float64 math on float32 inputs), independently of the C code.

The /v1/attend response examples depend on the engine's seeded weights, so they are captured from
a running `attnd --preset tiny --seed 0` by capture.sh instead; tests/check_server.c checks them
against the engine called directly.

Run with Debian's python3 (numpy): /usr/bin/python3 proto/examples/gen_examples.py
"""
import base64
import json
import os

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
TINY_HIDDEN = 64  # hidden_size of the engine's "tiny" preset (engine/attn.h)


class Num(float):
    """A float32 value, printed as the shortest decimal that reads back as the same float32."""

    def __repr__(self):
        return np.format_float_positional(np.float32(self), unique=True, trim="-")


def dump(obj):
    """Compact JSON with one tensor row per line."""
    if isinstance(obj, dict):
        return "{" + ", ".join(json.dumps(k) + ": " + dump(v) for k, v in obj.items()) + "}"
    if isinstance(obj, list):
        if all(isinstance(x, (Num, int)) for x in obj):
            return "[" + ",".join(repr(x) for x in obj) + "]"
        return "[" + ",\n ".join(dump(x) for x in obj) + "]"
    if isinstance(obj, Num):
        return repr(obj)
    return json.dumps(obj)


def write(name, obj):
    with open(os.path.join(HERE, name), "w") as f:
        f.write(dump(obj) + "\n")


def fmt(a):
    """Nested lists of float32 values."""
    a = np.asarray(a, dtype=np.float32)
    if a.ndim == 0:
        return Num(float(a))
    return [fmt(x) for x in a]


def b64(a):
    a = np.ascontiguousarray(a, dtype="<f4")
    return {"shape": list(a.shape), "b64": base64.b64encode(a.tobytes()).decode()}


def bf16(a):
    """float32 to the nearest bfloat16 (ties to even), as float32: what a bf16 cache holds."""
    u = np.ascontiguousarray(a, dtype=np.float32).view(np.uint32).astype(np.uint64)
    u = (u + 0x7FFF + ((u >> 16) & 1)) & 0xFFFF0000
    return u.astype(np.uint32).view(np.float32)


def visible(ip, tk, causal, window):
    """The keys query position ip sees: bottom-right causal, |ip - j| <= window."""
    return np.array([(not causal or j <= ip) and (window is None or abs(ip - j) <= window)
                     for j in range(tk)])


def sdpa_lse(q, k, causal, window, scale):
    """(H, Tq) log-sum-exp of each row's visible scores, as sdpa() masks them."""
    h, tq, dk = q.shape
    hkv, tk, _ = k.shape
    if scale is None:
        scale = 1.0 / np.sqrt(dk)
    out = np.full((h, tq), -np.inf)
    for hh in range(h):
        g = hh // (h // hkv)
        for i in range(tq):
            ip = i + tk - tq
            vis = visible(ip, tk, causal, window)
            s = scale * (k[g].astype(np.float64) @ q[hh, i].astype(np.float64))
            if vis.any():
                m = s[vis].max()
                out[hh, i] = m + np.log(np.exp(s[vis] - m).sum())
    return out.astype(np.float32)


def sdpa(q, k, v, causal, window, scale):
    """out[h] = softmax(scale q[h] k[g]^T + mask) v[g], g = h / (H / Hkv), bottom-right causal."""
    h, tq, dk = q.shape
    hkv, tk, _ = k.shape
    if scale is None:
        scale = 1.0 / np.sqrt(dk)
    q64, k64, v64 = (t.astype(np.float64) for t in (q, k, v))
    out = np.zeros((h, tq, v.shape[2]))
    w = np.zeros((h, tq, tk))
    for hh in range(h):
        g = hh // (h // hkv)
        for i in range(tq):
            ip = i + tk - tq
            vis = visible(ip, tk, causal, window)
            if not vis.any():
                continue
            s = scale * (k64[g] @ q64[hh, i])
            s = np.where(vis, s, -np.inf)
            p = np.exp(s - s[vis].max())
            p /= p.sum()
            w[hh, i] = p
            out[hh, i] = p @ v64[g]
    return out.astype(np.float32), w.astype(np.float32)


def main():
    rng = np.random.default_rng(4)

    # /v1/sdpa: GQA 4 query heads over 2 kv heads, Tq 3 < Tk 5 (bottom-right causal), window 2,
    # dv != dk.
    q = np.round(rng.standard_normal((4, 3, 4)), 3).astype(np.float32)
    k = np.round(rng.standard_normal((2, 5, 4)), 3).astype(np.float32)
    v = np.round(rng.standard_normal((2, 5, 3)), 3).astype(np.float32)
    out, w = sdpa(q, k, v, True, 2, None)
    write("sdpa.request.json", {"q": fmt(q), "k": fmt(k), "v": fmt(v), "causal": True,
                                "window": 2, "return_weights": True})
    write("sdpa.response.json", {"output": fmt(out), "weights": fmt(w),
                                 "timing": {"queue_ms": 0.012, "compute_ms": 0.004}})

    # A selection: heads 1 and 3 (-1), the last query row, as log-sum-exp, and as probabilities.
    lse = sdpa_lse(q, k, True, 2, None)
    write("sdpa_select.request.json", {"q": fmt(q), "k": fmt(k), "v": fmt(v), "causal": True,
                                       "window": 2,
                                       "return_weights": {"heads": [1, -1], "rows": [-1],
                                                          "kind": "lse"}})
    write("sdpa_select.response.json", {
        "output": fmt(out), "lse": fmt(lse[[1, 3]][:, [2]]),
        "selection": {"kind": "lse", "reduce": "none", "heads": [1, 3], "rows": [2],
                      "keys": [0, 5]},
        "timing": {"queue_ms": 0.012, "compute_ms": 0.004}})

    # The same tensors in base64, no mask, explicit scale, base64 output.
    out2, _ = sdpa(q, k, v, False, None, 0.25)
    write("sdpa_base64.request.json", {"q": b64(q), "k": b64(k), "v": b64(v), "scale": 0.25,
                                       "encoding_format": "base64"})
    write("sdpa_base64.response.json", {"output": b64(out2),
                                        "timing": {"queue_ms": 0.011, "compute_ms": 0.003}})

    # /v1/attend requests for `attnd --preset tiny --seed 0` (hidden 64).
    x5 = np.round(rng.standard_normal((5, TINY_HIDDEN)), 3).astype(np.float32)
    write("attend_stateless.request.json", {"x": fmt(x5[:2])})
    write("attend_prefill.request.json", {"session_id": "chat-42", "layer": 0, "x": fmt(x5[:3]),
                                          "return_weights": True})
    write("attend_decode.request.json", {"session_id": "chat-42", "layer": 0, "x": fmt(x5[3:4]),
                                         "expect_n_past": 3})
    write("attend_base64.request.json", {"session_id": "chat-b64", "x": b64(x5[:2]),
                                         "encoding_format": "base64"})
    write("attend_stream.request.json", {"session_id": "chat-stream", "x": fmt(x5[:2]),
                                         "stream": True})
    write("attend_select.request.json", {
        "session_id": "inspect-1", "x": fmt(x5[:3]),
        "return_weights": {"heads": [0, -1], "rows": [-1], "keys": [0, None]},
        "capture": ["head_out"], "head_mask": [1, 0, 1, 1]})
    write("truncate.request.json", {"n_tokens": 2})
    write("fork.request.json", {"new_id": "chat-42.branch"})

    # A batch of two sessions' steps and one that expects a length its session does not have.
    write("attend_batch.request.json", {"layer": 0, "steps": [
        {"session_id": "batch-a", "x": fmt(x5[:1])},
        {"session_id": "batch-b", "x": fmt(x5[1:3]), "return_weights": True},
        {"session_id": "batch-c", "x": fmt(x5[3:4]), "expect_n_past": 4}]})

    # /v1/kv/attend on tiny's geometry (4 heads, 2 KV heads of 16): the cache holds K and V as the
    # preset's default KV dtype does (bfloat16), so the golden answer rounds them the same way.
    q = np.round(rng.standard_normal((4, 3, 16)), 3).astype(np.float32)
    k = np.round(rng.standard_normal((2, 3, 16)), 3).astype(np.float32)
    v = np.round(rng.standard_normal((2, 3, 16)), 3).astype(np.float32)
    out, _ = sdpa(q, bf16(k), bf16(v), True, None, None)
    write("kv_attend.request.json", {"session_id": "kv-1", "layer": 1, "q": fmt(q), "k": fmt(k),
                                     "v": fmt(v)})
    write("kv_attend.response.json", {"session_id": "kv-1", "layer": 1, "n_past": 0,
                                      "n_tokens": 3, "output": fmt(out),
                                      "timing": {"queue_ms": 0.01, "compute_ms": 0.02}})


if __name__ == "__main__":
    main()
