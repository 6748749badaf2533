#!/usr/bin/env python3
"""tests/fuzz/seeds.py: writes a fuzz target's seed corpus into a directory, from the
repository's own inputs: the request examples in proto/examples/ and the checkpoints in
tests/data/. Standard library only.

usage: tests/fuzz/seeds.py TARGET OUT_DIR      (run from the repository's root)
"""
import base64
import glob
import hashlib
import json
import os
import struct
import sys


def examples(*patterns):
    for p in patterns:
        for f in sorted(glob.glob(os.path.join("proto/examples", p))):
            yield open(f, "rb").read()


def b64_strings():
    for body in examples("*base64.request.json"):
        doc = json.loads(body)
        for v in doc.values():
            if isinstance(v, dict) and "b64" in v:
                yield v["b64"].encode()
    for s in (b"", b"Zg==", b"Zm8=", b"Zm9v", b"Zm9vYmFy", b"Zh==", b"Zm9=", b"Zm=v"):
        yield s


def configs():
    for f in sorted(glob.glob("tests/data/*/config.json")):
        body = open(f, "rb").read()
        yield b"0" + body  # the first byte chooses --trust-layout: even = none
        yield b"1" + body
        if b"deepseek" in body:  # bits 1-2 choose --modeling-code: 2 transformers, 4 checkpoint
            yield b"2" + body
            yield b"4" + body
    # families no checkpoint in tests/data has: Mistral, whose window and KV heads default when
    # absent (MistralConfig's 4096 and 8) and whose null window is none
    base = {"model_type": "mistral", "hidden_size": 64, "num_attention_heads": 8,
            "num_hidden_layers": 2, "max_position_embeddings": 8192}
    yield b"0" + json.dumps(base).encode()
    yield b"0" + json.dumps(dict(base, num_key_value_heads=2, sliding_window=None,
                                 head_dim=16)).encode()
    yield b"1" + json.dumps(dict(base, sliding_window=128, rope_theta=1e6,
                                 rope_scaling={"rope_type": "linear", "factor": 2.0})).encode()


def safetensors(keep_data=4096):
    for f in sorted(glob.glob("tests/data/*/*.safetensors")):
        raw = open(f, "rb").read()
        if len(raw) < 8:
            yield raw
            continue
        (n,) = struct.unpack("<Q", raw[:8])
        # The header and a little data: tensors past the cut make the parser refuse the range,
        # which is a path too; the whole of a small file keeps its ranges valid.
        yield raw if len(raw) <= 8 + n + keep_data else raw[: 8 + n + keep_data]

    def st(header, data_bytes):
        h = json.dumps(header).encode()
        return struct.pack("<Q", len(h)) + h + b"\0" * data_bytes

    # metadata, an empty tensor beside another's start, ranges that touch, overlap or run past
    # the data, a name twice (JSON keeps both), a shape past 2^32
    yield st({"__metadata__": {"format": "pt"}, "a": {"dtype": "F32", "shape": [2],
                                                        "data_offsets": [0, 8]},
              "b": {"dtype": "BF16", "shape": [0, 3], "data_offsets": [8, 8]}}, 8)
    yield st({"a": {"dtype": "F16", "shape": [4], "data_offsets": [0, 8]},
              "e": {"dtype": "F16", "shape": [0], "data_offsets": [0, 0]},
              "b": {"dtype": "F16", "shape": [2, 2], "data_offsets": [4, 12]}}, 12)
    yield st({"a": {"dtype": "F32", "shape": [1], "data_offsets": [0, 4]},
              "b": {"dtype": "F32", "shape": [1], "data_offsets": [4, 12]}}, 8)
    yield (struct.pack("<Q", 120) + b'{"a":{"dtype":"F32","shape":[1],"data_offsets":[0,4]},'
           b'"a":{"dtype":"F32","shape":[1],"data_offsets":[4,8]}}' + b" " * 14 + b"\0" * 8)
    yield st({"w": {"dtype": "I8", "shape": [4294967297, 1], "data_offsets": [0, 1]}}, 1)


def session_files():
    """Session files (proto/session-file.md) of preset tiny's geometry, f32 K/V: the fuzz target
    writes the fingerprint and the checksum in itself."""
    def cache(n_tokens, window=0, first=0, dtype=1, queries=False):
        """window: the target's layer 0 is a 32-token sliding window, whose cache must say so
        (a ring may drop whole 16-token blocks before first); layer 1 and contexts have none.
        dtype: 1 f32, 2 bf16, 3 f16, 4 q8_0 (the file header's dtype picks the target's pool;
        q8_0's model has 32-value heads, a row one block: a binary16 scale and 32 int8);
        queries: kind 2, the 4 query heads' rows after the values (the header's flag bit 0)."""
        dim = 32 if dtype == 4 else 16
        head = struct.pack("<8i", 2 if queries else 0, dtype, 2, dim, dim, window, n_tokens,
                           first)
        n_rows = (2 * 2 + (4 if queries else 0)) * (n_tokens - first)
        vals = [((i * 37) % 101) / 50.0 - 1.0 for i in range(n_rows * dim)]
        if dtype == 1:
            rows = b"".join(struct.pack("<f", v) for v in vals)
        elif dtype == 2:
            rows = b"".join(struct.pack("<f", v)[2:] for v in vals)
        elif dtype == 3:
            rows = b"".join(struct.pack("<e", v) for v in vals)
        else:
            rows = b"".join(struct.pack("<e", 1.0 / 127) +
                            bytes((i * 37 + r) % 255 - 127 & 255 for i in range(32))
                            for r in range(n_rows))
        return head + rows

    def state(n_tokens):
        """a linear-attention layer's cache (kind 1): per KV head S (16 x 16) then z (16), as
        doubles (first = len: a state holds no rows)"""
        head = struct.pack("<8i", 1, 1, 2, 16, 16, 0, n_tokens, n_tokens)
        return head + b"".join(struct.pack("<d", ((i * 13) % 7) / 8.0)
                               for i in range(2 * (16 * 16 + 16)))

    def file(sections, sid=b"s", dtype=1, queries=False, linear=False):
        body = sid + b"\0" * (-len(sid) % 8)
        for kind, layer, payload in sections:
            body += struct.pack("<IiQ", kind, layer, len(payload)) + payload
            body += b"\0" * (-len(payload) % 8)
        total = 96 + len(body) + 8
        n_tokens = max([0] + [struct.unpack("<i", p[24:28])[0] for _, _, p in sections])
        header = b"ATTNDSES" + struct.pack("<II", 1, 96) + b"\0" * 32
        header += struct.pack("<IIIiQQ", dtype, len(sid), len(sections), n_tokens, total, 0)
        # flags; then the informative bytes, whose "layers held" bit 7 picks the target's model
        # with a linear layer 1
        header += struct.pack("<I", 1 if queries else 0) + b"\0" * 10
        header += bytes([0x80 if linear else 0, 0])
        return header + body + b"\0" * 8

    yield file([])
    yield file([(0, 0, cache(1))])
    yield file([(0, 0, cache(3)), (0, 1, cache(2))], b"chat-42")
    yield file([(0, 0, cache(5)), (1, 0, cache(4))])
    yield file([(0, 0, cache(3, 32)), (0, 1, cache(2))], b"chat-42")
    yield file([(0, 0, cache(5, 32)), (1, 0, cache(4)), (0, 1, cache(5)), (1, 1, cache(2))])
    yield file([(0, 0, cache(50, 32, 16)), (0, 1, cache(50))], b"ring")
    # the other pools: bf16, f16 and q8_0 K/V, queries kept (kind 2), a linear layer's state
    for dt in (2, 3):
        yield file([(0, 0, cache(3, 32, dtype=dt)), (1, 0, cache(2, dtype=dt)),
                    (0, 1, cache(3, dtype=dt))], b"half", dtype=dt)
    yield file([(0, 0, cache(3, 32, queries=True)), (0, 1, cache(2, queries=True))], b"qk",
               queries=True)
    yield file([(0, 0, cache(50, 32, 16, dtype=2, queries=True)),
                (0, 1, cache(50, dtype=2, queries=True))], b"ring-qk", dtype=2, queries=True)
    yield file([(0, 0, cache(4, 32)), (1, 0, cache(2)), (0, 1, state(4))], b"lin", linear=True)
    yield file([(0, 0, cache(3, 32, dtype=4)), (1, 0, cache(1, dtype=4)),
                (0, 1, cache(3, dtype=4))], b"q8", dtype=4)
    yield file([(0, 0, cache(50, 32, 16, dtype=4, queries=True)),
                (0, 1, cache(5, dtype=4, queries=True))], b"q8-qk", dtype=4, queries=True)
    yield file([(0, 1, state(7))], b"lin", linear=True)


def framed_bodies():
    """Bodies of the binary tensor extension: two bytes of JSON length, a byte choosing attend
    (even) or sdpa (odd), the JSON, the raw float32 (hidden 4 for attend, as the target's
    limits)."""
    def frame(kind, head, floats):
        j = json.dumps(head).encode()
        raw = b"".join(struct.pack("<f", v) for v in floats)
        return struct.pack("<HB", len(j), kind) + j + raw

    x = [0.5, -1.0, 0.25, 2.0] * 2
    yield frame(0, {"x": {"shape": [2, 4], "binary_data_size": 32}}, x)
    yield frame(0, {"x": {"shape": [2, 4], "datatype": "FP32", "binary_data_size": 32},
                    "session_id": "s", "binary_output": True, "return_weights": True}, x)
    yield frame(0, {"x": {"shape": [1, 4], "binary_data_size": 16},
                    "context": {"shape": [1, 4], "binary_data_size": 16}}, x)
    yield frame(1, {"q": {"shape": [1, 2, 2], "binary_data_size": 16},
                    "k": {"shape": [1, 2, 2], "binary_data_size": 16},
                    "v": {"shape": [1, 2, 2], "binary_data_size": 16}, "causal": True,
                    "binary_output": True}, x + x[:4])
    yield frame(2, {"session_id": "s", "q": {"shape": [2, 1, 2], "binary_data_size": 16},
                    "k": {"shape": [1, 1, 2], "binary_data_size": 8},
                    "v": {"shape": [1, 1, 2], "binary_data_size": 8}, "rope": True}, x)
    yield frame(2, {"layer": 1, "steps": [{"session_id": "a", "q": [[[1, 2]], [[3, 4]]],
                                           "k": [[[1, 0]]], "v": [[[0, 1]]]}]}, [])
    for body in examples("attend_*.request.json"):
        yield struct.pack("<HB", min(len(body), 65535), 0) + body

    def aligned(kind, head, floats):
        """kind | 4: tensors read where they lie, which needs the raw part 4-aligned: the JSON
        is padded with spaces so that 3 + its length is a multiple of 4."""
        j = json.dumps(head).encode()
        j += b" " * (-(3 + len(j)) % 4)
        raw = b"".join(struct.pack("<f", v) for v in floats)
        return struct.pack("<HB", len(j), kind | 4) + j + raw

    def t(shape):
        n = 1
        for d in shape:
            n *= d
        return {"shape": shape, "binary_data_size": 4 * n}

    yield aligned(0, {"x": t([2, 4])}, x)
    yield aligned(0, {"session_id": "s", "x": t([2, 4]), "head_mask": t([2]),
                      "return_weights": {"heads": [0, -1], "rows": [-1], "keys": [0, None]},
                      "capture": ["q", "head_out"], "binary_output": True}, x + [1.0, 0.0])
    yield aligned(0, {"x": t([1, 4]), "context": t([2, 4])}, x + x[:4])
    yield aligned(0, {"layer": 1, "binary_output": True,
                      "steps": [{"session_id": "a", "x": t([1, 4])},
                                {"session_id": "b", "x": t([2, 4]), "head_mask": t([2])}]},
                  x[:4] + x + [0.0, 1.0])
    yield aligned(2, {"session_id": "s", "q": t([2, 1, 2]), "k": t([1, 1, 2]),
                      "v": t([1, 1, 2]), "rope": True, "positions": [3],
                      "return_weights": True, "capture": ["k", "v"]}, x)
    yield aligned(2, {"layer": 1, "rope": True,
                      "steps": [{"session_id": "a", "q": t([2, 1, 2]), "k": t([1, 1, 2]),
                                 "v": t([1, 1, 2])},
                                {"session_id": "b", "q": t([2, 2, 2]), "k": t([1, 2, 2]),
                                 "v": t([1, 2, 2]), "head_mask": t([2])}]},
                  x + x + x + [1.0, 1.0])
    # masks read where they lie, then made bytes (attend's key_mask, SDPA's mask): what was
    # read in place must not be freed as a copy
    yield aligned(0, {"x": t([2, 4]), "key_mask": t([2])}, x + [1.0, 1.0])
    yield aligned(1, {"q": t([1, 2, 2]), "k": t([1, 2, 2]), "v": t([1, 2, 2]),
                      "mask": t([2, 2]), "binary_output": True},
                  x + x[:4] + [1.0, 0.0, 1.0, 1.0])
    # misaligned by one byte: the copying path of a body that may be borrowed from
    j = json.dumps({"x": t([1, 4])}).encode()
    j += b" " * (-(3 + len(j)) % 4 + 1)
    yield struct.pack("<HB", len(j), 4) + j + b"".join(struct.pack("<f", v) for v in x[:4])


def attend_bodies():
    """POST /v1/attend bodies beyond the examples, for the target's tiny limits (hidden 64, 4
    heads): every field, a cross-attention call, selections and captures, batches whose steps
    carry their own fields, and refusals of combinations."""
    yield from examples("attend_*.request.json", "error.request.json")

    def rows(t, width=64):
        return [[((i * 7 + j * 3) % 11) / 5.0 - 1.0 for j in range(width)] for i in range(t)]

    def b64(t):
        raw = b"".join(struct.pack("<f", v) for r in rows(t) for v in r)
        return {"shape": [t, 64], "b64": base64.b64encode(raw).decode()}

    x1, x2 = rows(1), rows(2)
    bodies = [
        {"session_id": "s", "x": x2, "positions": [7, 8], "expect_n_past": 3,
         "key_mask": [1, 0, 1, 1, 1], "layer": 1},
        {"session_id": "s", "x": x1, "stream": True, "positions": [0]},
        {"x": b64(2), "encoding_format": "base64", "return_weights": True},
        {"session_id": "s", "x": x2, "context": rows(3), "cross": True, "replace_context": True,
         "return_weights": {"heads": [1], "rows": [0, -1], "keys": [1, -1], "kind": "scores"},
         "capture": ["q", "head_out"]},
        {"session_id": "s", "x": x1, "cross": True, "return_weights": {"kind": "lse",
                                                                       "reduce": "mean_heads"}},
        {"session_id": "s", "x": x1, "context": rows(1), "cross": False},
        {"session_id": "s", "x": x1, "context": rows(1), "positions": [0]},
        {"session_id": "s", "x": x1, "replace_context": True},
        {"session_id": "s", "x": x2, "head_mask": [1, 0, 0.5, 1], "capture": ["k", "v", "q"],
         "return_weights": {"heads": [0, 2, 3], "rows": [-2], "keys": [None, 2],
                            "reduce": "max_heads", "kind": "probs"}},
        {"session_id": "s", "x": x1, "stream": True, "return_weights": {"rows": [0]}},
        {"session_id": "s", "x": x1, "head_mask": {"shape": [4], "b64": "AACAPwAAAAAAAIA/AAAAAA=="},
         "encoding_format": "float", "layer": None, "positions": None},
        {"layer": 1, "steps": [
            {"session_id": "a", "x": x1, "positions": [4], "expect_n_past": 4,
             "head_mask": [1, 1, 0, 1]},
            {"session_id": "b", "x": x2, "return_weights": {"heads": [-1], "rows": [1],
                                                             "keys": [0, 3]},
             "capture": ["head_out"]},
            {"session_id": "c", "x": b64(1)}], "encoding_format": "base64"},
        {"steps": [{"session_id": "a", "x": x1}, {"session_id": "a", "x": x1}]},
        {"steps": [{"session_id": "a", "x": x2, "return_weights": {"rows": [2]}}]},
        {"steps": [{"session_id": "a", "x": x1}], "stream": True},
        {"steps": []},
    ]
    for b in bodies:
        yield json.dumps(b).encode()


def sdpa_bodies():
    """POST /v1/sdpa bodies beyond the examples: masks of each shape (keys broadcast, queries x keys, and
    per batch), a batch dimension with GQA, linear attention, scale, window and selections."""
    yield from examples("sdpa*.request.json")

    def t(*shape):
        if len(shape) == 1:
            return [((i * 5) % 7) / 3.0 - 1.0 for i in range(shape[0])]
        return [t(*shape[1:]) for _ in range(shape[0])]

    q, k, v = t(4, 3, 2), t(2, 3, 2), t(2, 3, 2)
    bodies = [
        {"q": q, "k": k, "v": v, "mask": [[1, 0, 1]]},
        {"q": q, "k": k, "v": v, "mask": [[1, 0, 1], [1, 1, 0], [0, 1, 1]], "scale": 0.5},
        {"q": t(2, 4, 3, 2), "k": t(2, 2, 3, 2), "v": t(2, 2, 3, 3),
         "mask": [[[1, 1, 0], [1, 1, 1], [0, 0, 1]], [[1, 0, 0], [1, 1, 0], [1, 1, 1]]],
         "return_weights": {"heads": [-1], "rows": [0, 2], "keys": [1, None],
                            "kind": "scores", "reduce": "mean_heads"}},
        {"q": t(2, 4, 3, 2), "k": t(2, 2, 3, 2), "v": t(2, 2, 3, 2), "kind": "linear",
         "causal": True},
        {"q": q, "k": k, "v": v, "kind": "softmax", "causal": True, "window": 1,
         "return_weights": {"kind": "lse"}, "encoding_format": "float"},
        {"q": q, "k": k, "v": v, "kind": "linear", "return_weights": True},
        {"q": q, "k": k, "v": v, "kind": "linear", "mask": [[1, 1, 1]]},
        {"q": q, "k": k, "v": v, "mask": [[1, 2, 1]]},
        {"q": t(3, 3, 2), "k": k, "v": v},
        {"q": q, "k": k, "v": v, "causal": None, "window": None, "scale": None, "mask": None},
    ]
    for b in bodies:
        yield json.dumps(b).encode()


def session_ops(target):
    """truncate and fork bodies beyond the examples: bounds, null fields, ids at their limits"""
    name = "truncate" if target == "fuzz_truncate" else "fork"
    yield from examples(name + ".request.json")
    bodies = {
        "truncate": [{"n_tokens": 0, "layer": 1}, {"n_tokens": 5, "layer": None},
                     {"layer": 2, "n_tokens": 4096}, {"n_tokens": -1}, {"n_tokens": 2.0},
                     {"n_tokens": 1e3, "layer": 0}, {"n_tokens": 2, "n_tokens ": 3}],
        "fork": [{"new_id": "a"}, {"new_id": ""}, {"new_id": "x" * 128}, {"new_id": "x" * 129},
                 {"new_id": None}, {"new_id": "a b"}, {"new_id": "A.b_c:d-9"}],
    }[name]
    for b in bodies:
        yield json.dumps(b).encode()


def attention_queries():
    """GET /v1/sessions/{id}/attention queries: a cache length byte, then name=value&..."""
    for n, q in [(40, "layer=1&heads=0,2:4&rows=-3:&keys=5:-1&kind=scores"),
                 (7, "rows=all&kind=lse&reduce=mean_heads"), (0, "heads=-1&rows=&keys=:"),
                 (200, "layer=2&rows=10,3,3,150:160&reduce=max_heads"),
                 (5, "kind=lse&rows=1:3&keys=all"), (10, "layer=01&heads=all&rows=all&keys=0:0"),
                 (255, "heads=3,1,1&rows=-1&keys=-10:&reduce=none&kind=probs"),
                 (3, "layer=+1&kind=lse&reduce=mean_heads&keys=1:2")]:
        yield bytes([n]) + q.encode()


def log_values():
    """log_quote: two bytes of field size, then a client's bytes"""
    for size, value in [(8, b"/v1/attend"), (1024, "/v1/sessions/".encode() + "\u00e9".encode() * 600),
                        (40, b"GET"), (64, b'a"b\\c\n\x1b\x7f\xff\xc3'), (300, "\u20ac\U0001F600".encode() * 50),
                        (9, "\u00e9\u00e9\u00e9".encode()), (2055, b"x" * 3000)]:
        yield bytes([(size - 8) >> 8, (size - 8) & 255]) + value


SOURCES = {
    "fuzz_query": attention_queries,
    "fuzz_attend": attend_bodies,
    "fuzz_sdpa": sdpa_bodies,
    "fuzz_truncate": lambda: session_ops("fuzz_truncate"),
    "fuzz_fork": lambda: session_ops("fuzz_fork"),
    "fuzz_b64": b64_strings,
    "fuzz_hf_config": configs,
    "fuzz_safetensors": safetensors,
    "fuzz_snapshot": session_files,
    "fuzz_framed": framed_bodies,
    "fuzz_log": log_values,
}


def main():
    if len(sys.argv) != 3 or sys.argv[1] not in SOURCES:
        sys.exit("usage: seeds.py {%s} OUT_DIR" % ",".join(sorted(SOURCES)))
    out = sys.argv[2]
    os.makedirs(out, exist_ok=True)
    n = 0
    for seed in SOURCES[sys.argv[1]]():
        with open(os.path.join(out, hashlib.sha1(seed).hexdigest()), "wb") as f:
            f.write(seed)
        n += 1
    if n == 0:
        sys.exit("seeds.py: no seeds for %s (run from the repository's root)" % sys.argv[1])


if __name__ == "__main__":
    main()
