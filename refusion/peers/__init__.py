"""The peers' published decoding functions, and how refusion's presets take their calls.

``peer_function("fast_dllm.generate_with_dual_cache")`` describes one
(:class:`~refusion.peers.base.PeerFunction`); :func:`translate` turns the
arguments of a call into refusion's parts and parameters. One module per
peer: ``llada``, ``fast_dllm``, ``dream``, ``sdar``, ``reference`` (ReFusion's
own decoder), ``wino``, ``diffusion_gemma`` (transformers' own ``generate``), ``llada2`` (LLaDA 2.1's
editing ``generate``), ``dinfer`` (dInfer's CreditDecoding), ``d3llm`` (d3LLM's multi-block decoder), ``dkv``
(dKV-Cache's delayed cache), ``fast_dllm_v2`` (Fast-dLLM v2's ``generate``), ``d2f`` (D2F's pipelined blocks).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from refusion.errors import unknown_name
from refusion.peers.base import PeerCall, PeerFunction


def peer_functions() -> dict[str, PeerFunction]:
    """Every peer function refusion's presets take, by name."""
    from refusion.peers import (
        d2f,
        d3llm,
        diffusion_gemma,
        dinfer,
        dkv,
        dream,
        fast_dllm,
        fast_dllm_v2,
        llada,
        llada2,
        reference,
        sdar,
        wino,
    )

    modules = (
        llada,
        fast_dllm,
        dream,
        sdar,
        reference,
        wino,
        diffusion_gemma,
        llada2,
        dinfer,
        d3llm,
        dkv,
        fast_dllm_v2,
        d2f,
    )
    return {f.name: f for module in modules for f in module.FUNCTIONS}


def peer_function(name: str) -> PeerFunction:
    functions = peer_functions()
    if name not in functions:
        raise unknown_name("peer function", name, functions)
    return functions[name]


def translate(name: str, args: Mapping[str, Any], model: Any) -> PeerCall:
    """The peer function ``name``'s call with ``args`` (its own argument names) in refusion's terms, for ``model``."""
    return peer_function(name).translate(args, model)


__all__ = ["PeerCall", "PeerFunction", "peer_function", "peer_functions", "translate"]
