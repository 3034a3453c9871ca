"""``refusion serve``: an OpenAI-compatible HTTP server on a continuous-batching :class:`~refusion.batcher.Batcher`.

``create_app`` builds the FastAPI application for a batcher; ``serve``
loads a model and runs it under uvicorn. ``ServeDefaults`` are every
request's decoding defaults, ``ServePolicy`` what a request may send. Needs ``pip install refusion[serve]``.
See docs/serving.md for the API, the request fields and the streaming rules.

The names are imported on first use, so the command line can check its
flags (:mod:`refusion.serve.settings`) before FastAPI, torch or a model loads.
"""

from __future__ import annotations

import importlib
from typing import Any

#: public name -> the module that defines it
_EXPORTS = {
    "ServeDefaults": "refusion.serve.options",
    "ServePolicy": "refusion.serve.options",
    "create_app": "refusion.serve.app",
    "serve": "refusion.serve.runner",
}


def __getattr__(name: str) -> Any:
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module 'refusion.serve' has no attribute {name!r}")
    return getattr(importlib.import_module(module), name)


def __dir__() -> list[str]:
    return sorted({*globals(), *_EXPORTS})


__all__ = ["ServeDefaults", "ServePolicy", "create_app", "serve"]
