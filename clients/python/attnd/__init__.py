"""attnd: a Python client for attnd, the HTTP daemon that serves transformers' attention blocks.

    import numpy as np, attnd
    c = attnd.Client("http://127.0.0.1:8080")
    s = c.session("chat-1")
    h = c.model()["hidden_size"]
    r = s.attend(0, np.zeros((8, h), np.float32))                         # prefill of layer 0
    r = s.attend(0, np.zeros(h, np.float32), expect_n_past=r.n_tokens)    # one decode step
    r = s.attend(0, np.zeros(h, np.float32), weights=attnd.Selection(heads=[0], rows=[-1]))
    r.weights, r.selection                      # head 0's attention of that token: (1, 1, 10)

See clients/python/README.md.
"""

from .client import (
    AttendResult,
    CachedAttention,
    Client,
    Selection,
    Session,
    Stream,
    StreamEvent,
    StreamUsage,
)
from .errors import (
    AttndError,
    Conflict,
    Gone,
    InsufficientStorage,
    InvalidRequest,
    MethodNotAllowed,
    NotFound,
    PayloadTooLarge,
    QueueFull,
    ServerError,
    TransportError,
    Unauthorized,
    Unavailable,
)

__version__ = "0.1.0"

__all__ = [
    "Client",
    "Session",
    "Stream",
    "AttendResult",
    "Selection",
    "CachedAttention",
    "StreamEvent",
    "StreamUsage",
    "AttndError",
    "InvalidRequest",
    "Unauthorized",
    "NotFound",
    "MethodNotAllowed",
    "Conflict",
    "Gone",
    "PayloadTooLarge",
    "QueueFull",
    "ServerError",
    "Unavailable",
    "InsufficientStorage",
    "TransportError",
]
