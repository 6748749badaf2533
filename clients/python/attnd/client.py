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
from typing import Any, Dict, Iterator, List, Mapping, Optional, Sequence, Tuple, Union

import numpy as np

from . import _framing
from .errors import AttndError, TransportError, error_from_body, error_from_response

__all__ = ["Client", "Session", "AttendResult", "StreamEvent", "StreamUsage", "Stream"]

ArrayLike = Any  # numpy arrays, or anything np.asarray takes
StepResult = Union["AttendResult", AttndError]

# Failures that mean the server closed a keep-alive connection we believed open (its
# --idle-timeout-s, a restart, a proxy's own keep-alive limit) before it read our request.
_STALE = (http.client.RemoteDisconnected, ConnectionResetError, BrokenPipeError,
          ConnectionAbortedError)


@dataclass
class AttendResult:
    """One step's answer: ``output`` (T, hidden_size) from /v1/attend, (n_heads, T, head_dim) from
    /v1/kv/attend; ``weights`` (n_heads, T, n_tokens) when asked for, else None. ``n_past`` and
    ``n_tokens`` are the layer cache's length before and after the call: the next call's
    ``expect_n_past`` is this ``n_tokens``."""

    output: np.ndarray
    weights: Optional[np.ndarray]
    n_past: int
    n_tokens: int
    timing: Dict[str, float]
    session_id: Optional[str] = None
    layer: int = 0
    context_tokens: Optional[int] = None


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
    return AttendResult(
        output=output,
        weights=_framing.to_array(doc.get("weights")),
        n_past=int(doc.get("n_past", 0)),
        n_tokens=int(doc.get("n_tokens", 0)),
        timing=dict(doc.get("timing") or {}),
        session_id=doc.get("session_id"),
        layer=int(doc.get("layer", 0)),
        context_tokens=doc.get("context_tokens"),
    )


def _one_token(a: np.ndarray, rank: int) -> np.ndarray:
    """A single token's tensor given without its T axis gets one, so decode steps can pass what
    the model produced for one token as is."""
    if a.ndim == rank - 1:
        return a[None, :] if rank == 2 else a[:, None, :]
    return a


def _positions(p: Optional[Sequence[int]]) -> Optional[List[int]]:
    return None if p is None else [int(v) for v in np.asarray(p).reshape(-1)]


def _put(d: Dict[str, Any], key: str, value: Any) -> None:
    # Fields left at their default are not sent: the server's defaults then apply, and the
    # request stays valid for the routes and versions that do not know the field.
    if value is not None and value is not False:
        d[key] = value


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

    def _new_conn(self) -> http.client.HTTPConnection:
        cls = http.client.HTTPSConnection if self._https else http.client.HTTPConnection
        return cls(self._host, self._port, timeout=self.timeout)

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
                conn.request(method, self._prefix + path, body=body, headers=h)
                resp = conn.getresponse()
            except _STALE as e:
                self.close()
                if reused and attempt == 0:
                    continue
                raise TransportError(f"{method} {path}: connection lost: {e!r}") from e
            except (OSError, http.client.HTTPException) as e:
                self.close()
                raise TransportError(f"{method} {path}: {e!r}") from e
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

    def _get_json(self, path: str) -> Any:
        _, _, data = self._request("GET", path)
        return json.loads(data.decode("utf-8"))

    def _post_json(self, path: str, doc: Any) -> Any:
        _, _, data = self._request(
            "POST", path, json.dumps(doc).encode(), {"Content-Type": "application/json"}
        )
        return json.loads(data.decode("utf-8")) if data else None

    def _call(self, path: str, body: Dict[str, Any], session_id: Optional[str] = None) -> Any:
        """POSTs a body holding numpy tensors in this client's transport; the answer's tensors come
        back as arrays whichever transport carried them."""
        payload, headers = _framing.encode(body, self.transport)
        if session_id is not None:
            # Read by proxies that route sessions (docker/nginx.conf), which never parse bodies.
            headers["X-Session-Id"] = session_id
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

    def session(self, session_id: str) -> "Session":
        """A handle on a session id; nothing is sent until it is used (attnd creates a session on
        its first attend)."""
        return Session(self, session_id)

    def import_session(self, session_id: str, data: bytes) -> "Session":
        """Recreates a session from ``Session.export()``'s bytes, under any id, here or on another
        replica of the same model (Conflict ``fingerprint_mismatch`` otherwise)."""
        self._request(
            "PUT",
            _session_path(session_id),
            bytes(data),
            {"Content-Type": "application/octet-stream"},
        )
        return Session(self, session_id)

    # ---- stateless and batched attention --------------------------------------------------------

    def attend(
        self,
        layer: int,
        x: ArrayLike,
        weights: bool = False,
        positions: Optional[Sequence[int]] = None,
    ) -> AttendResult:
        """A stateless forward: the tokens attend to each other only, and nothing is kept."""
        body: Dict[str, Any] = {"layer": int(layer), "x": _one_token(_framing.as_f32(x, "x"), 2)}
        _put(body, "positions", _positions(positions))
        _put(body, "return_weights", bool(weights))
        return _result(self._call("/v1/attend", body))

    def attend_batch(
        self, layer: int, steps: Sequence[Union[Mapping[str, Any], Sequence[Any]]]
    ) -> List[StepResult]:
        """Many sessions' steps through one layer in one call, so that their decode steps run as one
        engine call (the weights read once for all).

        Each step is a dict with ``session_id`` (None: stateless), ``x`` and optionally
        ``expect_n_past``, ``positions``, ``weights``; or a tuple in that order. The answer is
        one entry per step, in order: an AttendResult, or **the typed exception object** of a
        step that failed where it met the server (its session evicted, ``expect_n_past`` off, the
        pool or queue full). Such failures are *returned, not raised*: the other steps ran and
        their results must not be lost; the failed step changed nothing and can be retried
        alone. A malformed batch (a bad shape, a session twice) raises, and nothing ran.
        """
        body_steps = []
        for i, s in enumerate(steps):
            d = _step_dict(s, ("session_id", "x", "expect_n_past", "positions", "weights"))
            step: Dict[str, Any] = {}
            _put(step, "session_id", d.get("session_id"))
            step["x"] = _one_token(_framing.as_f32(d["x"], f"steps[{i}].x"), 2)
            _put(step, "positions", _positions(d.get("positions")))
            _put(step, "expect_n_past", _opt_int(d.get("expect_n_past")))
            _put(step, "return_weights", bool(d.get("weights", False)))
            body_steps.append(step)
        doc = self._call("/v1/attend", {"layer": int(layer), "steps": body_steps})
        return _batch_results(doc)

    def kv_attend_batch(
        self,
        layer: int,
        steps: Sequence[Union[Mapping[str, Any], Sequence[Any]]],
        rope: bool = False,
    ) -> List[StepResult]:
        """``attend_batch`` for q/k/v steps (/v1/kv/attend): each step a dict with ``session_id``,
        ``q``, ``k``, ``v`` and optionally ``expect_n_past``, ``positions``, ``weights``, or a
        tuple in that order. Failed steps come back as exception objects, as in attend_batch."""
        body_steps = []
        for i, s in enumerate(steps):
            d = _step_dict(
                s, ("session_id", "q", "k", "v", "expect_n_past", "positions", "weights")
            )
            step: Dict[str, Any] = {"session_id": d["session_id"]}
            for name in ("q", "k", "v"):
                step[name] = _one_token(_framing.as_f32(d[name], f"steps[{i}].{name}"), 3)
            _put(step, "positions", _positions(d.get("positions")))
            _put(step, "expect_n_past", _opt_int(d.get("expect_n_past")))
            _put(step, "return_weights", bool(d.get("weights", False)))
            body_steps.append(step)
        body: Dict[str, Any] = {"layer": int(layer)}
        _put(body, "rope", bool(rope))
        body["steps"] = body_steps
        return _batch_results(self._call("/v1/kv/attend", body))

    # ---- streams --------------------------------------------------------------------------------

    def _open_stream(self, body: Dict[str, Any], session_id: Optional[str]) -> "Stream":
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
            h["X-Session-Id"] = session_id
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
    garbage collection) closes its connection, which stops the server's remaining steps: the
    cache then holds the events received plus at most the step that was running, so resync with
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
                doc = _framing.decode_tensors(json.loads(data))
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
    object holds nothing but the id, so it is free to make and to drop."""

    def __init__(self, client: Client, session_id: str) -> None:
        self.client = client
        self.id = session_id

    def __repr__(self) -> str:
        return f"Session({self.id!r})"

    def attend(
        self,
        layer: int,
        x: ArrayLike,
        weights: bool = False,
        positions: Optional[Sequence[int]] = None,
        expect_n_past: Optional[int] = None,
    ) -> AttendResult:
        """Appends x's T tokens to the layer's cache and returns their attention output. The first
        call of a layer is its prefill; later ones (often one token) are decode steps.
        ``expect_n_past`` makes a call on a cache of another length fail (Conflict) instead of
        silently attending to the wrong history."""
        body: Dict[str, Any] = {"session_id": self.id, "layer": int(layer)}
        body["x"] = _one_token(_framing.as_f32(x, "x"), 2)
        _put(body, "positions", _positions(positions))
        _put(body, "expect_n_past", _opt_int(expect_n_past))
        _put(body, "return_weights", bool(weights))
        return _result(self.client._call("/v1/attend", body, self.id))

    def kv_attend(
        self,
        layer: int,
        q: ArrayLike,
        k: ArrayLike,
        v: ArrayLike,
        rope: bool = False,
        positions: Optional[Sequence[int]] = None,
        expect_n_past: Optional[int] = None,
        weights: bool = False,
    ) -> AttendResult:
        """Attention on the caller's own projections: q (n_heads, T, head_dim), k and v
        (n_kv_heads, T, head_dim) (a 2-D tensor is one token). k and v are appended to the
        layer's cache; the output is each head's (n_heads, T, head_dim), before any o_proj.
        ``rope=True`` has the server rotate q and k at ``positions`` first."""
        body: Dict[str, Any] = {"session_id": self.id, "layer": int(layer)}
        for name, t in (("q", q), ("k", k), ("v", v)):
            body[name] = _one_token(_framing.as_f32(t, name), 3)
        _put(body, "positions", _positions(positions))
        _put(body, "expect_n_past", _opt_int(expect_n_past))
        _put(body, "return_weights", bool(weights))
        _put(body, "rope", bool(rope))
        return _result(self.client._call("/v1/kv/attend", body, self.id))

    def stream(
        self,
        layer: int,
        x: ArrayLike,
        weights: bool = False,
        positions: Optional[Sequence[int]] = None,
        expect_n_past: Optional[int] = None,
    ) -> Stream:
        """As ``attend``, one event per token as each is computed (see Stream). Errors found
        before the first step (a bad shape, a 409) raise here; later ones while iterating."""
        body: Dict[str, Any] = {"session_id": self.id, "layer": int(layer)}
        body["x"] = _one_token(_framing.as_f32(x, "x"), 2)
        _put(body, "positions", _positions(positions))
        _put(body, "expect_n_past", _opt_int(expect_n_past))
        _put(body, "return_weights", bool(weights))
        return self.client._open_stream(body, self.id)

    def info(self) -> Dict[str, Any]:
        """The session as the server holds it: tokens per layer, bytes, location, idle time."""
        return self.client._get_json(_session_path(self.id))

    def truncate(self, n_tokens: int, layer: Optional[int] = None) -> Dict[str, Any]:
        """Keeps the first n_tokens of every layer's cache (or of ``layer``'s only): the rollback of
        speculative decoding. Returns the session as truncated."""
        doc: Dict[str, Any] = {"n_tokens": int(n_tokens)}
        if layer is not None:
            doc["layer"] = int(layer)
        return self.client._post_json(_session_path(self.id) + "/truncate", doc)

    def fork(self, new_id: str) -> "Session":
        """A copy of every cache under ``new_id`` (its own blocks), e.g. to branch a beam."""
        self.client._post_json(_session_path(self.id) + "/fork", {"new_id": new_id})
        return Session(self.client, new_id)

    def delete(self) -> None:
        """Frees the caches; on an evicted id, forgets the tombstone so the id can be reused."""
        self.client._request("DELETE", _session_path(self.id))

    def export(self) -> bytes:
        """The session as one file (proto/session-file.md), for ``Client.import_session`` here or on
        another replica of the same model."""
        _, _, data = self.client._request("GET", _session_path(self.id) + "/export")
        return data


def _session_path(session_id: str) -> str:
    # Quoted whole, so an id with a "/" reaches attnd (which names it in a 400) instead of
    # silently hitting another route.
    return "/v1/sessions/" + urllib.parse.quote(str(session_id), safe="")


def _opt_int(v: Any) -> Optional[int]:
    return None if v is None else int(v)


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
