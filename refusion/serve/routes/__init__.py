"""The server's routes, one module per group: ``completions`` (``/v1/completions``, ``/v1/chat/completions``) and
``info`` (``/health``, ``/v1/models``, ``/metrics``). Each module has a FastAPI ``router``; routes read the server
through :func:`~refusion.serve.state.server_of`."""

from refusion.serve.routes import completions, info

ROUTERS = (completions.router, info.router)

__all__ = ["ROUTERS"]
