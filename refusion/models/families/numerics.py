"""The authors' arithmetic on transformers' stock classes, where a family's own code rounds differently.

In float32 a family's published class and the maintained transformers class
compute the same numbers; in bfloat16/float16 (how the checkpoints ship and
are run) a few steps round differently, and a different rounding changes
tokens. Each function here installs one of the authors' choices on a built
network, per module instance (the class, other models and other families are
left alone), reusing the stock module's own code wherever it can:

* :func:`float32_rotary`: rotary embeddings applied in float32 and rounded
  once (LLaDA's ``rope_full_precision``, on in the published configs). The
  stock rotary module's ``cos``/``sin`` stay float32 and every attention
  module runs its stock ``forward`` with the rotation done in float32;
* :func:`round_once_rms_norm`: RMSNorm multiplied by its weight in float32 and
  rounded once (flash-attn's ``rms_norm_fn``, which every SDAR norm calls;
  transformers' norms round before the multiply).

Families call them from :meth:`ModelFamily.numerics <refusion.models.families.base.ModelFamily.numerics>`.
In float32 each is an identity (the same numbers as the stock modules).
"""

from __future__ import annotations

import inspect
import types
from typing import Any

import torch

from refusion.errors import ConfigError


def rotate_half(x: torch.Tensor) -> torch.Tensor:
    """``cat(-x2, x1)`` over the last dimension's halves (the rotary convention of LLaMA, LLaDA and Qwen)."""
    half = x.shape[-1] // 2
    return torch.cat((-x[..., half:], x[..., :half]), dim=-1)


def rotary_in_float32(
    q: torch.Tensor, k: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, unsqueeze_dim: int = 1, **_: Any
) -> tuple[torch.Tensor, torch.Tensor]:
    """``q`` and ``k`` rotated in float32 by float32 ``cos``/``sin``, each rounded once to its own dtype.

    LLaDA's ``RotaryEmbedding.forward`` with ``rope_full_precision``:
    ``((t.float() * cos) + (rotate_half(t.float()) * sin)).type_as(t)``.
    Same signature as transformers' ``apply_rotary_pos_emb``.
    """
    cos = cos.unsqueeze(unsqueeze_dim).float()
    sin = sin.unsqueeze(unsqueeze_dim).float()
    qf, kf = q.float(), k.float()
    return (qf * cos + rotate_half(qf) * sin).to(q.dtype), (kf * cos + rotate_half(kf) * sin).to(k.dtype)


def _stock_function(method: Any) -> types.FunctionType:
    """The innermost function of a (possibly decorated) stock method."""
    return inspect.unwrap(method.__func__ if inspect.ismethod(method) else method)


def with_globals(function: Any, **replaced: Any) -> types.FunctionType:
    """A copy of ``function`` (unwrapped) whose module-level names ``replaced`` resolve to the given objects.

    The code is the stock code; only the names it looks up change. Raises
    :class:`ConfigError` when the code does not use one of the names (a
    transformers version that computes the step elsewhere).
    """
    inner = _stock_function(function)
    missing = [name for name in replaced if name not in inner.__code__.co_names]
    if missing:
        raise ConfigError(
            f"{inner.__qualname__} of this transformers version does not call {', '.join(missing)}; "
            "the authors' numerics cannot be installed on it (load the model with `dtype='float32'`, "
            "or with its own code: `adapter=...`, `trust_remote_code=True`)."
        )
    scope = dict(inner.__globals__)
    scope.update(replaced)
    copy = types.FunctionType(inner.__code__, scope, inner.__name__, inner.__defaults__, inner.__closure__)
    copy.__kwdefaults__ = inner.__kwdefaults__
    copy.__qualname__ = inner.__qualname__
    return copy


def _float32_cos_sin(rotary: torch.nn.Module) -> None:
    """Make a stock rotary-embedding module return float32 ``cos``/``sin`` whatever the hidden states' dtype."""
    stock = type(rotary).forward

    def forward(self, x, position_ids):
        return stock(self, x.new_empty(0, dtype=torch.float32), position_ids)

    rotary.forward = types.MethodType(forward, rotary)


def float32_rotary(model: torch.nn.Module) -> int:
    """Rotary embeddings of ``model`` in float32, rounded once (LLaDA's ``rope_full_precision``).

    ``model`` is a built transformers network whose attention modules call
    ``apply_rotary_pos_emb`` with the ``cos``/``sin`` of ``model``'s
    ``rotary_emb`` module (LLaMA, Qwen2, Qwen3). Returns the number of
    attention modules changed; raises :class:`ConfigError` when there is
    none or when their code does not apply rotary embeddings that way.
    """
    rotaries = [m for name, m in model.named_modules() if name.endswith("rotary_emb")]
    attentions = [m for m in model.modules() if hasattr(m, "q_proj") and hasattr(m, "k_proj") and hasattr(m, "o_proj")]
    if not rotaries or not attentions:
        raise ConfigError(f"{type(model).__name__} has no rotary embedding and attention modules to run in float32.")
    for rotary in rotaries:
        _float32_cos_sin(rotary)
    for attention in attentions:
        forward = with_globals(type(attention).forward, apply_rotary_pos_emb=rotary_in_float32)
        attention.forward = types.MethodType(forward, attention)
    return len(attentions)


def rms_norm_rounded_once(self: torch.nn.Module, hidden_states: torch.Tensor) -> torch.Tensor:
    """flash-attn's ``rms_norm_fn`` without residual: ``x * rstd * weight`` in float32, rounded once to ``x``'s dtype.

    ``rstd = 1 / sqrt(mean(x * x) + eps)`` with ``x`` in float32, as the
    kernel computes it.
    """
    x = hidden_states.float()
    rstd = 1 / torch.sqrt(x.square().mean(dim=-1, keepdim=True) + self.variance_epsilon)
    return (x * rstd * self.weight.float()).to(hidden_states.dtype)


def round_once_rms_norm(model: torch.nn.Module) -> int:
    """Every RMSNorm of ``model`` (modules with a ``weight`` and a ``variance_epsilon``) rounds once, after the
    weight multiply (:func:`rms_norm_rounded_once`). Returns the number of norms changed."""
    norms = [
        m
        for m in model.modules()
        if hasattr(m, "variance_epsilon") and isinstance(getattr(m, "weight", None), torch.nn.Parameter)
    ]
    if not norms:
        raise ConfigError(f"{type(model).__name__} has no RMSNorm modules to change.")
    for norm in norms:
        norm.forward = types.MethodType(rms_norm_rounded_once, norm)
    return len(norms)
