"""``refusion serve``: an OpenAI-compatible HTTP server on a continuous-batching :class:`~refusion.generator.Generator`.

``create_app`` builds the FastAPI application for a generator; ``serve``
loads a model and runs it under uvicorn. ``ServeDefaults`` are every
request's decoding defaults, ``ServePolicy`` what a request may send. Needs ``pip install refusion[serve]``.
See docs/serving.md for the API, the request fields and the streaming rules.
"""

from refusion.serve.app import create_app
from refusion.serve.options import ServeDefaults, ServePolicy
from refusion.serve.runner import serve

__all__ = ["ServeDefaults", "ServePolicy", "create_app", "serve"]
