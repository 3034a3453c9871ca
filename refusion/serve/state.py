"""What every route of a server reads: the batcher, the served name, the defaults, the policy, the metrics.

:func:`~refusion.serve.app.create_app` builds one :class:`ServerState` and
keeps it on ``app.state.server``; a route reaches it with :func:`server_of`.
"""

from __future__ import annotations

import threading
from typing import Any

import attrs

from refusion.batcher import Batcher
from refusion.errors import APIError
from refusion.serve.metrics import ServerMetrics
from refusion.serve.options import ServeDefaults, ServePolicy


@attrs.define(eq=False)
class ServerState:
    """One server: ``batcher`` served as ``model_name`` with every request's ``defaults`` under ``policy``.

    A full queue answers 503 with ``Retry-After: retry_after``. ``planning``
    serialises request planning (the tokenizer and the registry are not
    promised to be thread-safe).
    """

    batcher: Batcher
    model_name: str
    defaults: ServeDefaults
    policy: ServePolicy
    metrics: ServerMetrics
    retry_after: int
    planning: threading.Lock = attrs.field(factory=threading.Lock)

    def unavailable(self, message: str, code: str) -> APIError:
        """The 503 for a full queue (``queue_full``) or a server shutting down, with ``Retry-After``."""
        return APIError(
            503,
            message,
            type="server_overloaded" if code == "queue_full" else "service_unavailable",
            code=code,
            headers={"Retry-After": str(self.retry_after)},
        )


def server_of(request: Any) -> ServerState:
    """The :class:`ServerState` of the app that received ``request``."""
    return request.app.state.server
