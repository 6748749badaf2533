"""attnd's Python client: sessions, batches and streams over one keep-alive connection.

A model runner calls attnd once per layer per step, so a call's fixed costs dominate: the
client keeps one HTTP/1.1 connection open (no TCP handshake per call) and sends tensors as raw
float32 after the JSON by default (no printing or parsing of numbers). The three transports
carry the same float32 bits; ``json`` and ``base64`` exist for debugging with a proxy or a
packet capture, and for servers or proxies that cannot pass the binary framing.
"""

from __future__ import annotations

import http.client
import json
import urllib.parse
from dataclasses import dataclass, field
from typing import Any, Callable, Dict, Iterator, List, Mapping, Optional, Sequence, Tuple, Union

import numpy as np

from . import _framing, _http
from .errors import AttndError, TransportError, error_from_body, error_from_response

__all__ = [
    "Client",
    "Session",
    "AttendResult",
    "CachedAttention",
    "Selection",
    "StreamEvent",
    "StreamUsage",
    "Stream",
]

ArrayLike = Any  # numpy arrays, or anything np.asarray takes
StepResult = Union["AttendResult", AttndError]
# What ``weights=`` takes: False (nothing), True (every probability of the call), or a selection.
WeightsArg = Union[bool, "Selection", Mapping[str, Any]]
# An index spec of Session.attention: an int, a list (of ints, slices, ranges), a range, a slice,
# or the server's own text ("0,6:8", "-5:").
IndexSpec = Union[int, str, slice, range, Sequence[Any]]

KINDS = ("probs", "scores", "lse")
REDUCES = ("none", "mean_heads", "max_heads")
CAPTURES = ("q", "k", "v", "head_out")
SDPA_KINDS = ("softmax", "linear")

# Failures that mean the server closed a keep-alive connection we believed open (its
# --idle-timeout-s, a restart, a proxy's own keep-alive limit) before it read our request.
_STALE = (http.client.RemoteDisconnected, ConnectionResetError, BrokenPipeError,
          ConnectionAbortedError)


def _answer_after_send_error(conn: http.client.HTTPConnection) -> Any:
    """The response already in a connection whose request could not be sent whole, or None."""
    try:
        return conn.getresponse()
    except (OSError, http.client.HTTPException):
        return None


@dataclass(frozen=True)
class Selection:
    """Which part of a call's attention to return (``weights=Selection(...)``; a dict with the same
    keys works too): only these cells are computed, so a long context does not cost a full matrix.

    ``heads``: query heads (negative from the end), None = all. ``rows``: query rows *of this
    call*, 0..T-1 (``[-1]``: the last token), None = all. ``keys``: ``(start, end)`` of the call's
    n_past + T keys, python-style (negative from the end, None = the end), or a ``slice``; None =
    all. ``kind``: ``"probs"`` (answered as ``weights``), ``"scores"`` (before the softmax, after
    the scale and any soft-cap; masked cells -inf) or ``"lse"`` (per head and row, so that
    ``probs = exp(scores - lse)``). ``reduce``: ``"none"``, ``"mean_heads"`` or ``"max_heads"``
    (the heads axis is then dropped). The server sorts heads and rows and drops repeats; the
    answer's ``selection`` says what was resolved.
    """

    heads: Optional[Union[int, Sequence[int]]] = None
    rows: Optional[Union[int, Sequence[int]]] = None
    keys: Optional[Union[slice, Sequence[Optional[int]]]] = None
    kind: str = "probs"
    reduce: str = "none"

    def __post_init__(self) -> None:
        if self.kind not in KINDS:
            raise ValueError(f"kind must be one of {KINDS}, not {self.kind!r}")
        if self.reduce not in REDUCES:
            raise ValueError(f"reduce must be one of {REDUCES}, not {self.reduce!r}")

    def to_json(self) -> Dict[str, Any]:
        """The WeightsSelection object sent as ``return_weights`` (defaults left out)."""
        doc: Dict[str, Any] = {}
        _put(doc, "heads", _int_list(self.heads, "heads"))
        _put(doc, "rows", _int_list(self.rows, "rows"))
        _put(doc, "keys", _key_pair(self.keys))
        if self.kind != "probs":
            doc["kind"] = self.kind
        if self.reduce != "none":
            doc["reduce"] = self.reduce
        return doc


@dataclass
class AttendResult:
    """One step's answer: ``output`` (T, hidden_size) from /v1/attend, (n_heads, T, head_dim) from
    /v1/kv/attend; ``weights`` (n_heads, T, n_tokens) when asked for, else None. ``n_past`` and
    ``n_tokens`` are the layer cache's length before and after the call: the next call's
    ``expect_n_past`` is this ``n_tokens``.

    With a selection, its values are under its kind's name, shaped (heads, rows, keys), or (rows,
    keys) when reduced over heads: ``weights`` (probs), ``scores`` (masked cells -inf, whichever
    transport carried them) or ``lse`` ((heads, rows) or (rows,)); ``selection`` is the server's
    resolved echo ``{"kind", "reduce", "heads", "rows", "keys": [first, end]}``, with rows as
    indices of this call's tokens and keys of the layer's cache. ``capture`` maps each captured
    name to its tensor: ``q`` and ``head_out`` (n_heads, T, head_dim), ``k`` and ``v`` (n_kv_heads,
    T, head_dim). Every one of them is None when not asked for."""

    output: np.ndarray
    weights: Optional[np.ndarray]
    n_past: int
    n_tokens: int
    timing: Dict[str, float]
    session_id: Optional[str] = None
    layer: int = 0
    context_tokens: Optional[int] = None
    scores: Optional[np.ndarray] = None
    lse: Optional[np.ndarray] = None
    selection: Optional[Dict[str, Any]] = None
    capture: Optional[Dict[str, np.ndarray]] = None


@dataclass
class CachedAttention:
    """``Session.attention()``'s answer: the attention of tokens already in a layer's cache,
    recomputed from it. ``heads``, ``rows`` (cache indices of the query tokens) and ``keys``
    (``[first, end)`` cache indices) are what the server resolved; the values are under the
    kind's name as in AttendResult: ``weights`` (heads, rows, keys), ``scores`` (the same, masked
    cells -inf) or ``lse`` (heads, rows), without the heads axis when reduced. ``first_row`` is
    the first token whose attention can be recomputed (0 unless a sliding layer dropped blocks).
    """

    session_id: str
    layer: int
    n_tokens: int
    first_row: int
    kind: str
    reduce: str
    heads: List[int]
    rows: List[int]
    keys: List[int]
    weights: Optional[np.ndarray] = None
    scores: Optional[np.ndarray] = None
    lse: Optional[np.ndarray] = None

    @property
    def values(self) -> np.ndarray:
        """The selected values, whichever kind they are."""
        v = {"probs": self.weights, "scores": self.scores, "lse": self.lse}.get(self.kind)
        if v is None:
            raise TransportError(f"an attention answer of kind {self.kind!r} without its values")
        return v


@dataclass
class StreamEvent:
    """One token of a stream: ``output`` (hidden_size,); ``weights`` (n_heads, n_past + 1) when
    asked for, else None."""

    index: int
    position: int
    n_past: int
    output: np.ndarray
    weights: Optional[np.ndarray] = None


@dataclass
class StreamUsage:
    """The stream's closing summary (before ``[DONE]``)."""

    session_id: Optional[str]
    layer: int
    n_past: int
    n_tokens: int
    tokens: int
    timing: Dict[str, float] = field(default_factory=dict)


def _result(doc: Mapping[str, Any]) -> AttendResult:
    output = _framing.to_array(doc.get("output"))
    if output is None:
        raise TransportError("an attend answer without output")
    echo = doc.get("selection")
    selection = dict(echo) if isinstance(echo, Mapping) else None
    captured = doc.get("capture")
    capture: Optional[Dict[str, np.ndarray]] = None
    if isinstance(captured, Mapping):
        capture = {}
        for name, t in captured.items():
            a = _framing.to_array(t)
            if a is not None:
                capture[str(name)] = a
    return AttendResult(
        output=output,
        weights=_selected(doc, "weights", selection),
        n_past=int(doc.get("n_past", 0)),
        n_tokens=int(doc.get("n_tokens", 0)),
        timing=dict(doc.get("timing") or {}),
        session_id=doc.get("session_id"),
        layer=int(doc.get("layer", 0)),
        context_tokens=doc.get("context_tokens"),
        scores=_selected(doc, "scores", selection),
        lse=_selected(doc, "lse", selection, _lse_nulls(output, selection)),
        selection=selection,
        capture=capture,
    )


def _lse_nulls(
    output: np.ndarray, echo: Optional[Mapping[str, Any]]
) -> Optional[Callable[[np.ndarray], Any]]:
    """What a call's JSON-null lse is: -inf for a row that sees no key, NaN for a row whose score
    passed float's range. The heads of a row share its keys, so a row that sees none has a finite
    output (zeros, or the output bias), and a NaN row has NaN output: the output row tells."""
    if echo is None:
        return None
    rows = [int(r) for r in echo.get("rows") or []]
    reduced = echo.get("reduce", "none") != "none"
    nan = np.isnan(output)
    if output.ndim == 2:  # /v1/attend: (T, hidden)
        row_nan = nan.any(axis=1)
    elif output.ndim == 3:  # /v1/kv/attend, /v1/sdpa: (heads, T, dv)
        row_nan = nan.any(axis=(0, 2))
    elif output.ndim == 4:  # /v1/sdpa with a batch: (B, heads, T, dv)
        row_nan = nan.any(axis=(1, 3))
    else:
        return None

    def fill(where: np.ndarray) -> np.ndarray:
        f = np.where(row_nan[..., rows], np.float32(np.nan), np.float32(-np.inf))
        return f if reduced else f[..., None, :]

    return fill


def _cached_attention(
    doc: Mapping[str, Any], window_of: Optional[Callable[[int], Optional[int]]] = None
) -> CachedAttention:
    """``GET .../attention``'s answer, which is always JSON: its nulls are read from what a cached
    row is. Every row sees its own key, so a null lse is the NaN of a row whose score passed
    float's range, never the -inf of a row that sees none; a null score is a masked key (-inf)
    where the key comes after the row or, on a sliding layer (``window_of(layer)``, asked only
    when a null score is not after its row), lies outside its window, and otherwise a score past
    float's range (+inf)."""
    try:
        echo = {k: doc[k] for k in ("kind", "reduce", "heads", "rows", "keys")}
        out = CachedAttention(
            session_id=str(doc["session_id"]),
            layer=int(doc["layer"]),
            n_tokens=int(doc["n_tokens"]),
            first_row=int(doc["first_row"]),
            kind=str(echo["kind"]),
            reduce=str(echo["reduce"]),
            heads=[int(h) for h in echo["heads"]],
            rows=[int(r) for r in echo["rows"]],
            keys=[int(k) for k in echo["keys"]],
        )
    except (KeyError, TypeError, ValueError) as e:
        raise TransportError(f"an attention answer without its fields: {e!r}") from e
    out.weights = _selected(doc, "weights", echo)
    out.lse = _selected(doc, "lse", echo, lambda where: np.float32(np.nan))

    def score_nulls(where: np.ndarray) -> np.ndarray:
        rows = np.array(out.rows, np.int64)[:, None]
        keys = np.arange(out.keys[0], out.keys[1], dtype=np.int64)[None, :]
        masked = np.broadcast_to(keys > rows, where.shape)
        if window_of is not None and (where & ~masked).any():
            window = window_of(out.layer)
            if window:
                masked = masked | (rows - keys >= window)
        return np.where(masked, np.float32(-np.inf), np.float32(np.inf))

    out.scores = _selected(doc, "scores", echo, score_nulls)
    return out


def _selected(
    doc: Mapping[str, Any],
    name: str,
    echo: Optional[Mapping[str, Any]],
    nulls: Optional[Callable[[np.ndarray], Any]] = None,
) -> Optional[np.ndarray]:
    """A selected tensor (``weights``, ``scores`` or ``lse``) as float32.

    JSON writes a masked score, and the LSE of a row that sees no key, as null (JSON has no
    -inf), which ``to_array`` reads as NaN: here they become the -inf that base64 and the binary
    framing carry as is. Only JSON's: a NaN those carry is one the server sent (the lse of a row
    with a score past float's range), and stays NaN; JSON writes that NaN, and such a score's
    +inf, as null too, so over JSON they read as -inf unless ``nulls(where)`` says what they are
    (values broadcast to the tensor's shape, taken by the null cells only: a call's lse,
    ``_lse_nulls``; cached attention, ``_cached_attention``). And nested JSON
    arrays with an empty dimension lose the dimensions after it (``[[], []]``), so an empty
    selection takes its shape from the echo.
    """
    raw = doc.get(name)
    a = _framing.to_array(raw)
    if a is None:
        return None
    if name != "weights" and isinstance(raw, list):
        nan = np.isnan(a)
        if nan.any():
            fill: Any = np.float32(-np.inf)
            if nulls is not None:
                try:
                    fill = np.broadcast_to(nulls(nan), a.shape)
                except (ValueError, IndexError):
                    fill = np.float32(-np.inf)  # an answer that does not match its echo
            a = np.where(nan, fill, a).astype(np.float32)
    if a.size == 0 and echo is not None and echo.get("kind") in KINDS:
        shape: List[int] = []
        if echo.get("reduce", "none") == "none":
            shape.append(len(echo.get("heads") or []))
        shape.append(len(echo.get("rows") or []))
        keys = echo.get("keys") or [0, 0]
        if echo["kind"] != "lse":
            shape.append(max(0, int(keys[1]) - int(keys[0])))
        if int(np.prod(shape)) == 0 and a.ndim < len(shape):
            a = a.reshape(shape)
    return a


def _one_token(a: np.ndarray, rank: int) -> np.ndarray:
    """A single token's tensor given without its T axis gets one, so decode steps can pass what
    the model produced for one token as is."""
    if a.ndim == rank - 1:
        return a[None, :] if rank == 2 else a[:, None, :]
    return a


def _int(v: Any, name: str) -> int:
    """An int argument as given: a float (even 2.0), a bool or a string is a TypeError, never
    truncated into another layer or length."""
    if not _is_int(v):
        raise TypeError(f"{name}: expected an int, not {v!r}")
    return int(v)


def _vector(a: np.ndarray, name: str) -> np.ndarray:
    """A per-token, per-key or per-head argument as 1-D: (n,), or (1, n) / (n, 1) (a batch of one,
    a column), which hold the same n values. A shape with two dims past 1 ((layers, heads),
    (batch, T)) is refused rather than read row after row as one list of other meaning."""
    if sum(1 for d in a.shape if d > 1) > 1:
        raise ValueError(f"{name}: expected a 1-D array, not one of shape {a.shape}")
    return a.reshape(-1)


def _flag(v: Any, name: str) -> bool:
    """A bool argument as given: True, False (numpy's too) or the ints 1 and 0. A string ("false"
    is truthy), None or another number is a TypeError rather than read as Python's truth."""
    if isinstance(v, (bool, np.bool_)):
        return bool(v)
    if _is_int(v) and int(v) in (0, 1):
        return bool(v)
    raise TypeError(f"{name}: expected True or False, not {v!r}")


def _positions(p: Optional[Sequence[int]]) -> Optional[List[int]]:
    if p is None:
        return None
    a = np.asarray(p)
    if a.size == 0:
        raise ValueError("positions: empty (one per token, or None for the cache's order)")
    if a.dtype.kind not in "iu":
        raise TypeError(f"positions: expected ints, not {a.dtype} values")
    return [int(v) for v in _vector(a, "positions")]


def _put(d: Dict[str, Any], key: str, value: Any) -> None:
    # Fields left at their default are not sent: the server's defaults then apply, and the
    # request stays valid for the routes and versions that do not know the field.
    if value is not None and value is not False:
        d[key] = value


def _is_int(v: Any) -> bool:
    return isinstance(v, (int, np.integer)) and not isinstance(v, (bool, np.bool_))


def _int_list(v: Any, name: str) -> Optional[List[int]]:
    """A selection's heads or rows: None (all), an int, or any iterable of ints (a list, a range,
    a numpy array). A slice cannot be sent (the request's selection names indices; for "the
    last three rows" write ``[-3, -2, -1]``)."""
    if v is None:
        return None
    if _is_int(v):
        return [int(v)]
    if isinstance(v, (str, bytes, slice, Mapping)):
        raise TypeError(f"{name}: expected an int or a sequence of ints, not {v!r}")
    out = []
    for x in np.asarray(list(v) if isinstance(v, range) else v).reshape(-1).tolist():
        if not _is_int(x):
            raise TypeError(f"{name}: expected ints, not {x!r}")
        out.append(int(x))
    return out


def _key_pair(v: Any) -> Optional[List[Optional[int]]]:
    """A selection's keys: None (all), a slice or range of step 1, or a (start, end) pair whose ends
    are ints or None (python-style)."""
    if v is None:
        return None
    if isinstance(v, (slice, range)):
        if v.step not in (None, 1):
            raise ValueError(f"keys: a range of step 1 only, not {v!r}")
        pair = [v.start, v.stop]
        if isinstance(v, range) and v.start < 0 and v.stop == 0:
            pair[1] = None  # range(-3, 0): the last three keys
    elif isinstance(v, (str, bytes, Mapping)) or _is_int(v):
        raise TypeError(f"keys: expected (start, end) or a slice, not {v!r}")
    else:
        pair = list(v)
        if len(pair) != 2:
            raise ValueError(f"keys: expected (start, end), not {v!r}")
    for x in pair:
        if x is not None and not _is_int(x):
            raise TypeError(f"keys: each end is an int or None, not {x!r}")
    return [None if x is None else int(x) for x in pair]


def _return_weights(w: Any) -> Any:
    """``weights=`` as ``return_weights``: None (not sent), True, or a WeightsSelection object."""
    if isinstance(w, Selection):
        return w.to_json()
    if isinstance(w, Mapping):
        return Selection(**w).to_json()  # an unknown key is a TypeError naming it
    if w is None or isinstance(w, (bool, np.bool_)) or _is_int(w):
        return True if w else None
    raise TypeError(f"weights: expected a bool, a Selection or a dict, not {w!r}")


def _capture(names: Any) -> Optional[List[str]]:
    if names is None:
        return None
    if isinstance(names, str):
        names = [names]
    out: List[str] = []
    for n in names:
        if n not in CAPTURES:
            raise ValueError(f"capture: {n!r} is not one of {CAPTURES}")
        if n not in out:
            out.append(n)
    return out or None


def _head_mask(m: Any) -> Optional[List[float]]:
    # A plain JSON array of numbers, not a tensor: the float32 values, which Python prints exactly.
    return None if m is None else _vector(_framing.as_f32(m, "head_mask"), "head_mask").tolist()


def _key_mask(m: Any) -> Optional[List[int]]:
    """key_mask as the JSON array of 0 and 1 the server takes (bools and 0/1 numbers accepted)."""
    if m is None:
        return None
    a = _vector(np.asarray(m), "key_mask")
    if a.size == 0 or a.dtype.kind not in "biuf" or not np.isin(a, (0, 1)).all():
        raise ValueError(f"key_mask: expected 0s and 1s, one per key, not {m!r}")
    return [int(v) for v in a]


def _inspect(body: Dict[str, Any], weights: Any, capture: Any, head_mask: Any) -> None:
    _put(body, "return_weights", _return_weights(weights))
    _put(body, "capture", _capture(capture))
    _put(body, "head_mask", _head_mask(head_mask))


def _index_spec(v: Any, name: str) -> Optional[str]:
    """heads= or rows= of Session.attention as the query's text: comma lists of indices and
    ranges ``a:b`` (python-style, negative from the end). None (and ``slice(None)``) is all."""
    if v is None:
        return None
    if isinstance(v, str):
        return v
    if _is_int(v):
        return str(int(v))
    if isinstance(v, slice):
        if v.step not in (None, 1):
            raise ValueError(f"{name}: a slice of step 1 only, not {v!r}")
        if v.start is None and v.stop is None:
            return None
        return _colon(v.start, v.stop, name)
    if isinstance(v, range):
        if len(v) == 0:
            raise ValueError(f"{name}: {v!r} selects nothing")
        if v.step == 1 and (v.start >= 0 or v.stop <= 0):
            return _colon(v.start, v.stop if v.stop != 0 else None, name)
        return ",".join(str(i) for i in v)  # a stride, or a range across 0 (-2..1)
    if isinstance(v, (bytes, Mapping)):
        raise TypeError(f"{name}: expected ints, ranges, slices or a string, not {v!r}")
    parts = []
    for x in (v.reshape(-1).tolist() if isinstance(v, np.ndarray) else v):
        if not (_is_int(x) or isinstance(x, (slice, range))):
            raise TypeError(f"{name}: expected ints, ranges or slices, not {x!r}")
        p = _index_spec(x, name)
        if p is None:
            return None  # a slice(None) among others is still everything
        parts.append(p)
    if not parts:
        raise ValueError(f"{name}: an empty list selects nothing (None selects all)")
    return ",".join(parts)


def _keys_spec(v: Any) -> Optional[str]:
    """keys= of Session.attention: one range, as for a Selection's keys (or its text ``a:b``)."""
    if v is None or isinstance(v, str):
        return v
    pair = _key_pair(v)
    if pair is None or pair == [None, None]:
        return None
    return _colon(pair[0], pair[1], "keys")


def _colon(a: Any, b: Any, name: str) -> str:
    for x in (a, b):
        if x is not None and not _is_int(x):
            raise TypeError(f"{name}: range ends are ints or None, not {x!r}")
    return f"{'' if a is None else int(a)}:{'' if b is None else int(b)}"


class Client:
    """A connection to one attnd server.

    One keep-alive connection is reused for every call; when the server has closed it in the
    meantime (idle timeout, restart), the call is sent again once on a fresh connection: only a
    failure *before any answer* on a *reused* connection is retried, which is what a closed idle
    connection looks like. Pass ``expect_n_past`` on session calls if even that retry must never
    apply a step twice (a mismatch is then a Conflict, not a doubled token).

    Not thread-safe: use one Client per thread (connections are cheap; sessions live on the
    server, so any Client can continue any session).
    """

    def __init__(
        self,
        url: str = "http://127.0.0.1:8080",
        api_key: Optional[str] = None,
        timeout: Optional[float] = 600.0,
        transport: str = "binary",
    ) -> None:
        """``timeout`` bounds each socket operation in seconds (None: wait forever). It is long by
        default because attnd never times out a request waiting for the engine: a queued call or
        a long prefill legitimately takes that long. ``transport`` is ``"binary"`` (default),
        ``"base64"`` or ``"json"``."""
        if transport not in _framing.TRANSPORTS:
            raise ValueError(f"transport must be one of {_framing.TRANSPORTS}, not {transport!r}")
        u = urllib.parse.urlsplit(url if "://" in url else "http://" + url)
        if u.scheme not in ("http", "https") or not u.hostname:
            raise ValueError(f"url must be http://host[:port][/prefix], not {url!r}")
        self.url = url
        self.transport = transport
        self.timeout = timeout
        self._https = u.scheme == "https"
        self._host = u.hostname
        self._port = u.port or (443 if self._https else 80)
        self._prefix = u.path.rstrip("/")  # behind a proxy that mounts attnd under a path
        self._headers = {"User-Agent": "attnd-python/0.1", "Accept": "application/json"}
        if api_key:
            self._headers["Authorization"] = f"Bearer {api_key}"
        self._conn: Optional[http.client.HTTPConnection] = None

    # ---- connection ---------------------------------------------------------------------------

    def _new_conn(self) -> Any:
        if self._https:
            return http.client.HTTPSConnection(self._host, self._port, timeout=self.timeout)
        return _http.Connection(self._host, self._port, timeout=self.timeout)

    def close(self) -> None:
        """Closes the keep-alive connection (a later call opens a new one)."""
        if self._conn is not None:
            self._conn.close()
            self._conn = None

    def __enter__(self) -> "Client":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    def _exchange(
        self, method: str, path: str, body: Optional[bytes], headers: Mapping[str, str]
    ) -> Tuple[int, http.client.HTTPMessage, bytes]:
        h = dict(self._headers)
        h.update(headers)
        for attempt in (0, 1):
            reused = self._conn is not None
            if self._conn is None:
                self._conn = self._new_conn()
            conn = self._conn
            try:
                try:
                    conn.request(method, self._prefix + path, body=body, headers=h)
                except (BrokenPipeError, ConnectionResetError) as e:
                    # The server may have answered before it read the whole body (413 past
                    # --max-body-mb, 401) and closed: its answer waits in the socket. Without
                    # one, the connection was stale.
                    resp = _answer_after_send_error(conn)
                    if resp is None:
                        raise e
                else:
                    resp = conn.getresponse()
            except _STALE as e:
                self.close()
                if reused and attempt == 0:
                    continue
                raise TransportError(f"{method} {path}: connection lost: {e!r}") from e
            except (OSError, http.client.HTTPException) as e:
                self.close()
                raise TransportError(f"{method} {path}: {e!r}") from e
            except BaseException:
                # A header http.client cannot write (a value with a newline, or past latin-1), an
                # interrupt: the connection is left mid-request, and every later call on it would
                # fail with CannotSendRequest.
                self.close()
                raise
            try:
                data = resp.read()
            except (OSError, http.client.HTTPException) as e:
                # The server had answered, so it may have run the request: never sent again.
                self.close()
                raise TransportError(f"{method} {path}: answer cut short: {e!r}") from e
            if resp.will_close:
                self.close()
            return resp.status, resp.headers, data
        raise AssertionError("unreachable")

    def _request(
        self,
        method: str,
        path: str,
        body: Optional[bytes] = None,
        headers: Optional[Mapping[str, str]] = None,
    ) -> Tuple[int, http.client.HTTPMessage, bytes]:
        status, rh, data = self._exchange(method, path, body, headers or {})
        if not 200 <= status < 300:
            raise error_from_response(status, data, rh)
        return status, rh, data

    def _get_json(self, path: str, headers: Optional[Mapping[str, str]] = None) -> Any:
        _, _, data = self._request("GET", path, None, headers)
        return _framing.loads(data)

    def _post_json(
        self, path: str, doc: Any, headers: Optional[Mapping[str, str]] = None
    ) -> Any:
        h = {"Content-Type": "application/json"}
        h.update(headers or {})
        _, _, data = self._request("POST", path, json.dumps(doc).encode(), h)
        return json.loads(data.decode("utf-8")) if data else None

    def _call(
        self,
        path: str,
        body: Dict[str, Any],
        session_id: Optional[str] = None,
        route: Optional[Mapping[str, str]] = None,
    ) -> Any:
        """POSTs a body holding numpy tensors in this client's transport; the answer's tensors come
        back as arrays whichever transport carried them."""
        payload, headers = _framing.encode(body, self.transport)
        if session_id is not None:
            # Read by proxies that route sessions (docker/nginx.conf), which never parse bodies.
            _put_session_header(headers, session_id)
        headers.update(route or {})
        _, rh, data = self._request("POST", path, payload, headers)
        try:
            return _framing.decode(data, rh.get(_framing.HEADER))
        except ValueError as e:
            raise TransportError(f"POST {path}: undecodable answer: {e}") from e

    # ---- server -------------------------------------------------------------------------------

    def model(self) -> Dict[str, Any]:
        """The served model's config (Hugging Face names, plus ``attnd`` facts and fingerprint)."""
        return self._get_json("/v1/model")

    def sessions(self) -> List[Dict[str, Any]]:
        """Every live session, most recently used first."""
        return list(self._get_json("/v1/sessions")["sessions"])

    def pool(self) -> Dict[str, Any]:
        """The KV pool's use and limit."""
        return dict(self._get_json("/v1/sessions")["pool"])

    def health(self) -> Dict[str, Any]:
        """``/healthz``: answered on attnd's event loop, so it says the process is up even while
        every worker is busy."""
        return self._get_json("/healthz")

    def ready(self) -> bool:
        """``/readyz``: False once the server drains (stop sending it new sessions)."""
        status, _, _ = self._exchange("GET", "/readyz", None, {})
        return status == 200

    def session(self, session_id: str, route_key: Optional[str] = None) -> "Session":
        """A handle on a session id; nothing is sent until it is used (attnd creates a session on
        its first attend). ``route_key``: behind the proxy of docker/, the id whose replica holds
        the session when it is not its own (a fork's copy lives beside its source: the source's
        route key, which ``Session.fork`` sets itself); every call of the session then sends it
        as ``X-Route-Key``."""
        return Session(self, session_id, route_key)

    def import_session(
        self, session_id: str, data: bytes, route_key: Optional[str] = None
    ) -> "Session":
        """Recreates a session from ``Session.export()``'s bytes, under any id, here or on another
        replica of the same model (Conflict ``fingerprint_mismatch`` otherwise). ``route_key`` as
        for ``session()``: a fork's copy is imported with its source's, to land beside it."""
        headers = {"Content-Type": "application/octet-stream"}
        headers.update(_route_headers(route_key))
        self._request("PUT", _session_path(session_id), bytes(data), headers)
        return Session(self, session_id, route_key)

    # ---- stateless and batched attention --------------------------------------------------------

    def attend(
        self,
        layer: int,
        x: ArrayLike,
        weights: WeightsArg = False,
        positions: Optional[Sequence[int]] = None,
        capture: Optional[Sequence[str]] = None,
        head_mask: Optional[ArrayLike] = None,
        key_mask: Optional[Sequence[int]] = None,
        context: Optional[ArrayLike] = None,
    ) -> AttendResult:
        """A stateless forward: the tokens attend to each other only, and nothing is kept.
        ``weights``, ``capture``, ``head_mask``, ``key_mask`` (T values) and ``context`` (the
        queries attend to these encoder states instead) as for ``Session.attend``."""
        body: Dict[str, Any] = {
            "layer": _int(layer, "layer"),
            "x": _one_token(_framing.as_f32(x, "x"), 2),
        }
        _put(body, "positions", _positions(positions))
        _inspect(body, weights, capture, head_mask)
        _put(body, "key_mask", _key_mask(key_mask))
        if context is not None:
            body["context"] = _framing.as_f32(context, "context")
        return _result(self._call("/v1/attend", body))

    def attend_batch(
        self, layer: int, steps: Sequence[Union[Mapping[str, Any], Sequence[Any]]]
    ) -> List[StepResult]:
        """Many sessions' steps through one layer in one call, so that their decode steps run as one
        engine call (the weights read once for all).

        Each step is a dict with ``session_id`` (None: stateless), ``x`` and optionally
        ``expect_n_past``, ``positions``, ``weights``, ``capture``, ``head_mask`` (as for
        ``Session.attend``); or a tuple in that order. The answer is
        one entry per step, in order: an AttendResult, or **the typed exception object** of a
        step that failed where it met the server (its session evicted, ``expect_n_past`` off, the
        pool or queue full). Such failures are *returned, not raised*: the other steps ran and
        their results must not be lost; the failed step changed nothing and can be retried
        alone. A malformed batch (a bad shape, a session twice) raises, and nothing ran.
        """
        body_steps = []
        for i, s in enumerate(steps):
            d = _step_dict(s, ("session_id", "x", "expect_n_past", "positions", "weights",
                               "capture", "head_mask"))
            step: Dict[str, Any] = {}
            _put(step, "session_id", d.get("session_id"))
            step["x"] = _one_token(_framing.as_f32(d["x"], f"steps[{i}].x"), 2)
            _put(step, "positions", _positions(d.get("positions")))
            _put(step, "expect_n_past", _opt_int(d.get("expect_n_past")))
            _inspect(step, d.get("weights"), d.get("capture"), d.get("head_mask"))
            body_steps.append(step)
        doc = self._call("/v1/attend", {"layer": _int(layer, "layer"), "steps": body_steps})
        return _batch_results(doc)

    def kv_attend_batch(
        self,
        layer: int,
        steps: Sequence[Union[Mapping[str, Any], Sequence[Any]]],
        rope: bool = False,
    ) -> List[StepResult]:
        """``attend_batch`` for q/k/v steps (/v1/kv/attend): each step a dict with ``session_id``,
        ``q``, ``k``, ``v`` and optionally ``expect_n_past``, ``positions``, ``weights``,
        ``capture``, ``head_mask``, or a tuple in that order. Failed steps come back as exception
        objects, as in attend_batch."""
        body_steps = []
        for i, s in enumerate(steps):
            d = _step_dict(
                s, ("session_id", "q", "k", "v", "expect_n_past", "positions", "weights",
                    "capture", "head_mask")
            )
            missing = [n for n in ("session_id", "q", "k", "v") if d.get(n) is None]
            if missing:
                # every q/k/v step is a session's (the server has no stateless kv/attend)
                raise TypeError(f"steps[{i}] needs {', '.join(missing)}")
            step: Dict[str, Any] = {"session_id": d["session_id"]}
            for name in ("q", "k", "v"):
                step[name] = _one_token(_framing.as_f32(d[name], f"steps[{i}].{name}"), 3)
            _put(step, "positions", _positions(d.get("positions")))
            _put(step, "expect_n_past", _opt_int(d.get("expect_n_past")))
            _inspect(step, d.get("weights"), d.get("capture"), d.get("head_mask"))
            body_steps.append(step)
        body: Dict[str, Any] = {"layer": _int(layer, "layer")}
        _put(body, "rope", _flag(rope, "rope"))
        body["steps"] = body_steps
        return _batch_results(self._call("/v1/kv/attend", body))

    def sdpa(
        self,
        q: ArrayLike,
        k: ArrayLike,
        v: ArrayLike,
        causal: bool = False,
        window: Optional[int] = None,
        scale: Optional[float] = None,
        mask: Optional[ArrayLike] = None,
        weights: WeightsArg = False,
        kind: str = "softmax",
    ) -> AttendResult:
        """Stateless scaled-dot-product attention on the caller's tensors (``POST /v1/sdpa``): no
        session, no model weights. q (H, Tq, dk), k (Hkv, Tk, dk), v (Hkv, Tk, dv), each
        optionally with a leading batch dimension B (then the answer has it too); query head h
        reads KV head h // (H / Hkv). Query i sits at key index i + Tk - Tq (bottom-right
        alignment). ``causal`` hides later keys; ``window`` (an int) hides keys further than it on
        either side; ``scale`` defaults to 1/sqrt(dk); ``mask`` is the seeds' boolean mask (1
        attends, 0 masks) shaped (B, Tq, Tk), (B, 1, Tk) or (Tq, Tk), a bool array works.
        ``weights`` as for ``Session.attend`` (True: (H, Tq, Tk) probabilities, or a Selection,
        per batch element). ``kind="linear"`` computes linear attention instead (no window, scale,
        mask or weights then). The answer is an AttendResult whose ``output`` is (H, Tq, dv) (or
        (B, H, Tq, dv)); its ``n_past``, ``n_tokens`` and ``layer`` are 0, ``session_id`` None."""
        if kind not in SDPA_KINDS:
            raise ValueError(f"kind must be one of {SDPA_KINDS}, not {kind!r}")
        body: Dict[str, Any] = {name: _framing.as_f32(t, name) for name, t in
                                (("q", q), ("k", k), ("v", v))}
        if mask is not None:
            body["mask"] = _framing.as_f32(mask, "mask")  # a tensor, in the call's transport
        if kind != "softmax":
            body["kind"] = kind
        _put(body, "causal", _flag(causal, "causal"))
        _put(body, "window", _opt_int(window, "window"))
        if scale is not None:
            if isinstance(scale, (bool, np.bool_)) or not isinstance(scale, (int, float, np.number)):
                raise TypeError(f"scale: expected a number, not {scale!r}")
            body["scale"] = float(scale)
        _put(body, "return_weights", _return_weights(weights))
        return _result(self._call("/v1/sdpa", body))

    # ---- streams --------------------------------------------------------------------------------

    def _open_stream(
        self,
        body: Dict[str, Any],
        session_id: Optional[str],
        route: Optional[Mapping[str, str]] = None,
    ) -> "Stream":
        # Events are JSON text (the binary framing is refused with stream), so tensors travel as
        # base64 unless the caller chose plain JSON.
        body = dict(body)
        body["stream"] = True
        payload, headers = _framing.encode(
            body, "json" if self.transport == "json" else "base64"
        )
        h = dict(self._headers)
        h.update(headers)
        h["Accept"] = "text/event-stream"
        if session_id is not None:
            _put_session_header(h, session_id)
        h.update(route or {})
        # A connection of its own: the Client stays usable while the stream is read, and a stream
        # abandoned half way must close its connection (that is what stops the server's
        # remaining steps) without taking the Client's keep-alive connection with it.
        conn = self._new_conn()
        try:
            conn.request("POST", self._prefix + "/v1/attend", body=payload, headers=h)
            resp = conn.getresponse()
        except (OSError, http.client.HTTPException) as e:
            conn.close()
            raise TransportError(f"POST /v1/attend (stream): {e!r}") from e
        if resp.status != 200:
            data = resp.read()
            conn.close()
            raise error_from_response(resp.status, data, resp.headers)
        return Stream(conn, resp)


class Stream:
    """The events of a streamed attend, one StreamEvent per token as the server computes it.

    ``usage`` holds the closing StreamUsage once iteration has finished. A failure at a later step
    arrives as an error event and is raised here as its typed exception (the steps before it
    stay in the cache). Leaving a stream early (``close()``, ``break`` in a ``with`` block, or
    garbage collection) closes its connection, which stops the server's remaining steps once it
    sees the close; until then it goes on, and the socket buffers hold many small events, so the
    cache holds at least the events received, maybe every token sent: resync with
    ``Session.info()`` or ``expect_n_past`` before continuing.
    """

    def __init__(self, conn: http.client.HTTPConnection, resp: http.client.HTTPResponse) -> None:
        self._conn: Optional[http.client.HTTPConnection] = conn
        self._resp = resp
        self.usage: Optional[StreamUsage] = None
        self.done = False

    def __iter__(self) -> Iterator[StreamEvent]:
        return self

    def __next__(self) -> StreamEvent:
        while True:
            if self.done or self._conn is None:
                raise StopIteration
            data = self._next_data()
            if data is None:
                self.close()
                raise TransportError("the stream ended without [DONE]")
            if data == "[DONE]":
                self.done = True
                self.close()
                raise StopIteration
            try:
                doc = _framing.decode_tensors(_framing.loads(data))
            except ValueError as e:
                self.close()
                raise TransportError(f"an undecodable stream event: {e}") from e
            if "error" in doc:
                self.close()
                raise error_from_body(None, doc)
            if "usage" in doc:
                self.usage = StreamUsage(
                    session_id=doc.get("session_id"),
                    layer=int(doc.get("layer", 0)),
                    n_past=int(doc.get("n_past", 0)),
                    n_tokens=int(doc.get("n_tokens", 0)),
                    tokens=int((doc.get("usage") or {}).get("tokens", 0)),
                    timing=dict(doc.get("timing") or {}),
                )
                continue
            out = _framing.to_array(doc.get("output"))
            if out is None:
                self.close()
                raise TransportError("a stream event without output")
            return StreamEvent(
                index=int(doc["index"]),
                position=int(doc["position"]),
                n_past=int(doc["n_past"]),
                output=out,
                weights=_framing.to_array(doc.get("weights")),
            )

    def _next_data(self) -> Optional[str]:
        """The next event's data (its ``data:`` lines joined), or None at the end of the body."""
        lines: List[str] = []
        while True:
            try:
                raw = self._resp.readline()
            except (OSError, http.client.HTTPException) as e:
                self.close()
                raise TransportError(f"stream: {e!r}") from e
            if not raw:
                return "\n".join(lines) if lines else None
            line = raw.decode("utf-8").rstrip("\r\n")
            if line == "":
                if lines:
                    return "\n".join(lines)
                continue
            if line.startswith(":"):
                continue  # an SSE comment (keep-alive)
            name, _, value = line.partition(":")
            if name == "data":
                lines.append(value[1:] if value.startswith(" ") else value)

    def close(self) -> None:
        if self._conn is not None:
            self._conn.close()
            self._conn = None

    def __enter__(self) -> "Stream":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    def __del__(self) -> None:
        self.close()


class Session:
    """A session id on one Client. The state (one KV cache per layer) lives on the server; this
    object holds nothing but the id (and the route key of a fork's copy), so it is free to make
    and to drop."""

    def __init__(self, client: Client, session_id: str, route_key: Optional[str] = None) -> None:
        self.client = client
        self.id = session_id
        # Behind the proxy of docker/, which routes by X-Route-Key before X-Session-Id and the
        # path: a fork's copy is made on its source's replica, so its calls must name the source.
        self.route_key = None if route_key == session_id else route_key
        self._route = _route_headers(self.route_key)

    def __repr__(self) -> str:
        if self.route_key is not None:
            return f"Session({self.id!r}, route_key={self.route_key!r})"
        return f"Session({self.id!r})"

    def attend(
        self,
        layer: int,
        x: ArrayLike,
        weights: WeightsArg = False,
        positions: Optional[Sequence[int]] = None,
        expect_n_past: Optional[int] = None,
        capture: Optional[Sequence[str]] = None,
        head_mask: Optional[ArrayLike] = None,
        key_mask: Optional[Sequence[int]] = None,
        context: Optional[ArrayLike] = None,
        cross: bool = False,
        replace_context: bool = False,
    ) -> AttendResult:
        """Appends x's T tokens to the layer's cache and returns their attention output. The first
        call of a layer is its prefill; later ones (often one token) are decode steps.
        ``expect_n_past`` makes a call on a cache of another length fail (Conflict) instead of
        silently attending to the wrong history.

        Inspection: ``weights=True`` returns every probability of the call (``result.weights``,
        (n_heads, T, n_tokens)); a ``Selection`` (or a dict of its fields) only the cells it
        names, as probabilities, scores or LSE (``result.weights``, ``.scores``, ``.lse``, and
        ``.selection``). ``capture`` (names among ``q``, ``k``, ``v``, ``head_out``) returns
        those per-head tensors of the call in ``result.capture``. ``head_mask`` (n_heads factors)
        scales each head's output before o_proj, for this call only (the cache is unchanged by
        it).

        ``key_mask`` (n_past + T zeros and ones, one per key after the call) hides keys from this
        call's queries (padding), for this call only. Cross-attention: ``context`` (S,
        hidden_size) encoder states are projected and kept for the layer (409 ``context_exists``
        if it holds one, unless ``replace_context``), and the queries attend to them; later calls
        with ``cross=True`` attend to the kept context without resending it
        (``result.context_tokens``; the layer's own cache is unchanged)."""
        body: Dict[str, Any] = {"session_id": self.id, "layer": _int(layer, "layer")}
        body["x"] = _one_token(_framing.as_f32(x, "x"), 2)
        _put(body, "positions", _positions(positions))
        _put(body, "expect_n_past", _opt_int(expect_n_past))
        _inspect(body, weights, capture, head_mask)
        _put(body, "key_mask", _key_mask(key_mask))
        if context is not None:
            body["context"] = _framing.as_f32(context, "context")
        _put(body, "cross", _flag(cross, "cross"))
        _put(body, "replace_context", _flag(replace_context, "replace_context"))
        return _result(self.client._call("/v1/attend", body, self.id, self._route))

    def kv_attend(
        self,
        layer: int,
        q: ArrayLike,
        k: ArrayLike,
        v: ArrayLike,
        rope: bool = False,
        positions: Optional[Sequence[int]] = None,
        expect_n_past: Optional[int] = None,
        weights: WeightsArg = False,
        capture: Optional[Sequence[str]] = None,
        head_mask: Optional[ArrayLike] = None,
    ) -> AttendResult:
        """Attention on the caller's own projections: q (n_heads, T, head_dim), k and v
        (n_kv_heads, T, head_dim) (a 2-D tensor is one token). k and v are appended to the
        layer's cache; the output is each head's (n_heads, T, head_dim), before any o_proj.
        ``rope=True`` has the server rotate q and k at ``positions`` first. ``weights``,
        ``capture`` and ``head_mask`` as for ``attend`` (q and k captured after any RoPE;
        ``head_out`` is the output before ``head_mask``, which here scales each head's rows of
        ``output``)."""
        body: Dict[str, Any] = {"session_id": self.id, "layer": _int(layer, "layer")}
        for name, t in (("q", q), ("k", k), ("v", v)):
            body[name] = _one_token(_framing.as_f32(t, name), 3)
        _put(body, "positions", _positions(positions))
        _put(body, "expect_n_past", _opt_int(expect_n_past))
        _inspect(body, weights, capture, head_mask)
        _put(body, "rope", _flag(rope, "rope"))
        return _result(self.client._call("/v1/kv/attend", body, self.id, self._route))

    def stream(
        self,
        layer: int,
        x: ArrayLike,
        weights: bool = False,
        positions: Optional[Sequence[int]] = None,
        expect_n_past: Optional[int] = None,
    ) -> Stream:
        """As ``attend``, one event per token as each is computed (see Stream). Errors found
        before the first step (a bad shape, a 409) raise here; later ones while iterating.
        ``weights`` is True or False only: selections, capture and head_mask do not stream."""
        if isinstance(weights, (Selection, Mapping)):
            raise TypeError("stream: weights is True or False (a selection does not stream)")
        body: Dict[str, Any] = {"session_id": self.id, "layer": _int(layer, "layer")}
        body["x"] = _one_token(_framing.as_f32(x, "x"), 2)
        _put(body, "positions", _positions(positions))
        _put(body, "expect_n_past", _opt_int(expect_n_past))
        _put(body, "return_weights", _return_weights(weights))
        return self.client._open_stream(body, self.id, self._route)

    def info(self) -> Dict[str, Any]:
        """The session as the server holds it: tokens per layer, bytes, location, idle time."""
        return self.client._get_json(_session_path(self.id), self._route)

    def attention(
        self,
        layer: Optional[int] = None,
        heads: Optional[IndexSpec] = None,
        rows: Optional[IndexSpec] = None,
        keys: Optional[Union[str, slice, range, Sequence[Optional[int]]]] = None,
        kind: str = "probs",
        reduce: str = "none",
    ) -> CachedAttention:
        """The attention of tokens already in ``layer``'s cache (default the first loaded layer),
        recomputed from it as the forward computed it when each token was new
        (``GET /v1/sessions/{id}/attention``); nothing is appended.

        ``heads`` and ``rows`` (cache indices of the query tokens) take an int, a ``range``, a
        ``slice`` (``slice(-5, None)``: the last five), a list mixing those, or the server's
        text (``"0,6:8"``); negative counts from the end, None is all. ``keys`` is one range:
        ``(start, end)`` with None ends, a slice, a range of step 1, or ``"a:b"``. ``kind`` and
        ``reduce`` as for a ``Selection``.

        Needs a server started with ``--keep-queries 1``: otherwise Conflict with code
        ``queries_not_kept``. With ``--kv-dtype f32`` the values equal the calls' own weights
        to float rounding; with bf16 to bf16's rounding of the stored queries and keys."""
        if kind not in KINDS:
            raise ValueError(f"kind must be one of {KINDS}, not {kind!r}")
        if reduce not in REDUCES:
            raise ValueError(f"reduce must be one of {REDUCES}, not {reduce!r}")
        query: List[Tuple[str, str]] = []
        if layer is not None:
            query.append(("layer", str(_int(layer, "layer"))))
        for name, spec in (("heads", _index_spec(heads, "heads")),
                           ("rows", _index_spec(rows, "rows")), ("keys", _keys_spec(keys))):
            if spec is not None:
                query.append((name, spec))
        if kind != "probs":
            query.append(("kind", kind))
        if reduce != "none":
            query.append(("reduce", reduce))
        path = _session_path(self.id) + "/attention"
        if query:
            path += "?" + urllib.parse.urlencode(query, safe=":,")
        def window_of(layer_index: int) -> Optional[int]:
            for entry in self.client.model().get("attnd", {}).get("layers", []):
                if entry.get("layer") == layer_index:
                    return entry.get("sliding_window")
            return None

        return _cached_attention(self.client._get_json(path, self._route), window_of)

    def truncate(self, n_tokens: int, layer: Optional[int] = None) -> Dict[str, Any]:
        """Keeps the first n_tokens of every layer's cache (or of ``layer``'s only): the rollback of
        speculative decoding. Returns the session as truncated."""
        doc: Dict[str, Any] = {"n_tokens": _int(n_tokens, "n_tokens")}
        if layer is not None:
            doc["layer"] = _int(layer, "layer")
        return self.client._post_json(_session_path(self.id) + "/truncate", doc, self._route)

    def fork(self, new_id: str) -> "Session":
        """A copy of every cache under ``new_id`` (its own blocks), e.g. to branch a beam. The copy
        is made where this session lives, so the returned Session routes by this one's route key
        (``route_key``: sent as ``X-Route-Key``, which the proxy of docker/ routes by)."""
        self.client._post_json(_session_path(self.id) + "/fork", {"new_id": new_id}, self._route)
        return Session(self.client, new_id, self.route_key or self.id)

    def delete(self) -> None:
        """Frees the caches; on an evicted id, forgets the tombstone so the id can be reused."""
        self.client._request("DELETE", _session_path(self.id), None, self._route)

    def export(self) -> bytes:
        """The session as one file (proto/session-file.md), for ``Client.import_session`` here or on
        another replica of the same model."""
        _, _, data = self.client._request(
            "GET", _session_path(self.id) + "/export", None, self._route
        )
        return data


def _route_headers(route_key: Optional[str]) -> Dict[str, str]:
    if route_key is None:
        return {}
    if not _header_safe(str(route_key)):
        raise ValueError(f"route_key: a session id, not {route_key!r}")
    return {"X-Route-Key": str(route_key)}


def _header_safe(v: str) -> bool:
    return 0 < len(v) and all(" " < ch < "\x7f" for ch in v)


def _put_session_header(headers: Dict[str, str], session_id: str) -> None:
    # An id that cannot be a header value (a space, a newline, a character past ASCII) is left to
    # the body's session_id, which attnd refuses with a 400 naming it.
    if _header_safe(str(session_id)):
        headers["X-Session-Id"] = str(session_id)


def _session_path(session_id: str) -> str:
    # Quoted whole, so an id with a "/" reaches attnd (which names it in a 400) instead of
    # silently hitting another route.
    return "/v1/sessions/" + urllib.parse.quote(str(session_id), safe="")


def _opt_int(v: Any, name: str = "expect_n_past") -> Optional[int]:
    return None if v is None else _int(v, name)


def _step_dict(
    s: Union[Mapping[str, Any], Sequence[Any]], names: Tuple[str, ...]
) -> Dict[str, Any]:
    if isinstance(s, Mapping):
        unknown = set(s) - set(names)
        if unknown:
            raise TypeError(f"unknown step fields {sorted(unknown)} (known: {list(names)})")
        return dict(s)
    items = list(s)
    if len(items) > len(names):
        raise TypeError(f"a step tuple has at most {len(names)} items: {list(names)}")
    return dict(zip(names, items))


def _batch_results(doc: Mapping[str, Any]) -> List[StepResult]:
    out: List[StepResult] = []
    for r in doc.get("results", []):
        if "error" in r and "output" not in r:
            out.append(error_from_body(r.get("status"), r["error"]))
        else:
            out.append(_result(r))
    return out
