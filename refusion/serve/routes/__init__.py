"""The server's routes, one module per group: ``completions`` (``/v1/completions``, ``/v1/chat/completions``),
``info`` (``/health``, ``/v1/models``, ``/metrics``) and ``tokenizer`` (vLLM's ``/tokenize``, ``/detokenize``,
``/tokenizer_info``). Each module has a FastAPI ``router``; routes read the server through
:func:`~refusion.serve.state.server_of`."""

from refusion.serve.routes import completions, info, tokenizer

ROUTERS = (completions.router, info.router, tokenizer.router)

__all__ = ["ROUTERS"]
