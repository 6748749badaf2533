#!/usr/bin/env python3
"""tests/fuzz/seeds.py: writes a fuzz target's seed corpus into a directory, from the
repository's own inputs: the request examples in proto/examples/ and the checkpoints in
tests/data/. Standard library only.

usage: tests/fuzz/seeds.py TARGET OUT_DIR      (run from the repository's root)
"""
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


SOURCES = {
    "fuzz_attend": lambda: examples("attend_*.request.json", "error.request.json"),
    "fuzz_sdpa": lambda: examples("sdpa*.request.json"),
    "fuzz_truncate": lambda: examples("truncate.request.json"),
    "fuzz_fork": lambda: examples("fork.request.json"),
    "fuzz_b64": b64_strings,
    "fuzz_hf_config": configs,
    "fuzz_safetensors": safetensors,
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
