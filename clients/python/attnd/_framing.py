"""Tensors on the wire: nested JSON arrays, base64 objects, or the KServe v2 binary extension.

The request is built as a plain dict whose tensors are numpy arrays; ``encode`` turns it into
bytes for one transport and ``decode`` turns any answer back into the same dict shape with numpy
arrays. Walking the dict in insertion order is what ties the two halves of a framed body
together: ``json.dumps`` writes fields in that order and attnd takes raw tensors "in the order
the fields appear", so collecting the raw bytes during the same walk cannot misorder them (a
batch's ``steps[0].x``, ``steps[1].x``, ...). Answers are walked the same way, since
``json.loads`` keeps the server's field order.
"""

from __future__ import annotations

import base64
import json
from typing import Any, Dict, List, Optional, Tuple

import numpy as np

TRANSPORTS = ("binary", "base64", "json")

# The extension's header: the length of the JSON part of a framed body, in either direction.
HEADER = "Inference-Header-Content-Length"

_F32 = np.dtype("<f4")


def as_f32(a: Any, name: str) -> np.ndarray:
    """A C-contiguous little-endian float32 copy (or view) of ``a``: what every transport sends,
    so that the three give the server the same bits."""
    if a is None:
        raise TypeError(f"{name}: expected an array of numbers, not None")
    src = np.asarray(a)
    if src.dtype.kind not in "biuf":
        # complex would lose its imaginary part, strings and objects mean a caller's mistake
        raise TypeError(f"{name}: expected real numbers, not {src.dtype} values")
    with np.errstate(over="ignore"):
        arr = np.ascontiguousarray(src.astype(_F32, copy=False))
    if arr.dtype != _F32:  # a big-endian host: asarray gives native order
        arr = arr.astype(_F32)
    if arr.size == 0:
        raise ValueError(f"{name}: empty tensor")
    # attnd refuses non-finite inputs (400); JSON cannot even carry them. Saying so here, with
    # the tensor's name, is the same answer for every transport and costs one pass.
    if not np.isfinite(arr).all():
        if src.dtype.kind == "f" and np.isfinite(src).all():
            raise ValueError(f"{name}: values beyond float32's range (|x| > 3.4e38)")
        raise ValueError(f"{name}: non-finite values (attnd takes finite float32 only)")
    return arr


def encode(body: Dict[str, Any], transport: str) -> Tuple[bytes, Dict[str, str]]:
    """The request body's bytes and the extra headers for ``transport``.

    ``json``: tensors as nested arrays (Python prints a float32's double exactly, and attnd rounds
    it back to the same float32); ``base64``: ``{"shape", "b64"}`` both ways; ``binary``: the
    JSON part, then every tensor's raw bytes, answers framed likewise.
    """
    if transport not in TRANSPORTS:
        raise ValueError(f"transport must be one of {TRANSPORTS}, not {transport!r}")
    raw: List[bytes] = []
    doc = _encode_value(body, transport, raw)
    if transport == "base64":
        doc["encoding_format"] = "base64"
    elif transport == "binary":
        doc["binary_output"] = True
    head = json.dumps(doc, separators=(",", ":"), allow_nan=False).encode("utf-8")
    if transport != "binary":
        return head, {"Content-Type": "application/json"}
    return b"".join([head] + raw), {
        "Content-Type": "application/octet-stream",
        HEADER: str(len(head)),
    }


def _encode_value(v: Any, transport: str, raw: List[bytes]) -> Any:
    if isinstance(v, np.ndarray):
        arr = np.ascontiguousarray(v, dtype=_F32)  # as_f32 checked it when the body was built
        if transport == "json":
            return arr.tolist()
        if transport == "base64":
            return {"shape": list(arr.shape), "b64": base64.b64encode(arr.tobytes()).decode()}
        raw.append(arr.tobytes())
        return {"shape": list(arr.shape), "binary_data_size": arr.nbytes}
    if isinstance(v, dict):
        return {k: _encode_value(x, transport, raw) for k, x in v.items()}
    if isinstance(v, (list, tuple)):
        return [_encode_value(x, transport, raw) for x in v]
    return v


def _parse_int(s: str) -> Any:
    # attnd prints an integral float without a point, so a tensor's -0.0 arrives as "-0", which
    # Python's json reads as the int 0: the sign bit (which base64 and the binary framing carry)
    # would be lost. No integer field of an answer is ever negative zero.
    return -0.0 if s == "-0" else int(s)


def loads(text: Any) -> Any:
    """An answer's JSON (bytes or str), with "-0" read as the float -0.0 it was."""
    if isinstance(text, (bytes, bytearray)):
        text = text.decode("utf-8")
    return json.loads(text, parse_int=_parse_int)


def decode(body: bytes, header_len: Optional[str]) -> Any:
    """The answer as JSON with every tensor a float32 numpy array.

    A framed answer (``header_len`` from the response's Inference-Header-Content-Length) is cut
    into its JSON and raw parts, and each ``{"shape", "binary_data_size"}`` takes its bytes in
    order; base64 objects are decoded where they stand. Nested number arrays are left as lists
    here: only the caller knows which fields are tensors (``positions`` is a list too).
    """
    if header_len is None:
        return decode_tensors(loads(body))
    try:
        n = int(header_len)
    except ValueError:
        raise ValueError(f"{HEADER} is not a length: {header_len!r}") from None
    if n < 0 or n > len(body):
        raise ValueError(f"{HEADER} {n} is outside the body's {len(body)} bytes")
    doc = loads(body[:n])
    cursor = [n]
    out = _decode_value(doc, body, cursor)
    if cursor[0] != len(body):
        raise ValueError(f"{len(body) - cursor[0]} bytes after the last tensor of a framed answer")
    return out


def decode_tensors(v: Any) -> Any:
    """Base64 tensor objects of an unframed answer (JSON, a stream event) turned into arrays."""
    return _decode_value(v, b"", [0])


def _decode_value(v: Any, raw: bytes, cursor: List[int]) -> Any:
    if isinstance(v, dict):
        if "shape" in v and "binary_data_size" in v:
            size = int(v["binary_data_size"])
            start = cursor[0]
            if start + size > len(raw):
                raise ValueError("a framed answer's tensor runs past the end of the body")
            cursor[0] = start + size
            return _reshape(np.frombuffer(raw, _F32, size // 4, start), v["shape"])
        if "shape" in v and "b64" in v:
            data = base64.b64decode(v["b64"], validate=True)
            return _reshape(np.frombuffer(data, _F32), v["shape"])
        return {k: _decode_value(x, raw, cursor) for k, x in v.items()}
    if isinstance(v, list):
        return [_decode_value(x, raw, cursor) for x in v]
    return v


def _reshape(flat: np.ndarray, shape: Any) -> np.ndarray:
    # frombuffer views are read-only and keep the whole body alive: give the caller its own array.
    return flat.reshape([int(d) for d in shape]).astype(np.float32)


def to_array(v: Any) -> Optional[np.ndarray]:
    """A tensor field of an answer as float32, whichever transport carried it. JSON writes a
    non-finite output value as null; numpy reads None as NaN, which is what it was."""
    if v is None:
        return None
    if isinstance(v, np.ndarray):
        return v
    return np.array(v, dtype=np.float64).astype(np.float32)
