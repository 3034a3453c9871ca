"""Turning logits into draft tokens and their confidences.

A sampler is a small callable, in the spirit of transformers' LogitsProcessor:
``sampler(logits, exclude=None, generator=None)`` receives logits of shape
``(n, vocab)``, the id it must never pick (the mask token) and the decode's
``torch.Generator``, and returns ``(tokens, confidence)``, both of shape
``(n,)``, where ``confidence`` is the probability of the chosen token under the
distribution it was drawn from. It must not modify the logits in place.

A sampler whose ``accepts_scores`` attribute is true receives a
:class:`~refusion.decoding.scores.Scores` instead and may avoid the full logits (the
greedy sampler takes the fused argmax path); others get ``scores.logits``.
Confidences are float32 at least (float64 for float64 models), unless a
sampler's ``precision`` says otherwise: ``"logits"`` computes probabilities
with ``torch.softmax`` in the logits' own dtype (what LLaDA's ``generate``,
Dream, SDAR and ReFusion's reference do, so a bfloat16 model's confidences
are bfloat16 and tie as theirs do), ``"float64"`` in float64 (Fast-dLLM).
"""

from __future__ import annotations

from typing import Any, Protocol

import attrs
import torch

from refusion.decoding.scores import Scores
from refusion.dtypes import reduction_dtype
from refusion.errors import ConfigError, bad_value
from refusion.validators import is_integer, is_number, one_of, optional, positive_int, probability


class Sampler(Protocol):
    """A draw of one token per row: ``(tokens, confidences)``. Samplers with ``draws_canvas`` or ``draws_block``
    also take the rows' ``positions`` and ``canvas_length`` or ``block`` (:func:`sample_with`)."""

    def __call__(
        self,
        logits: torch.Tensor,
        exclude: int | None = None,
        generator: torch.Generator | None = None,
        **where: Any,
    ) -> tuple[torch.Tensor, torch.Tensor]: ...


#: how probabilities may be computed: refusion's float32 reduction, the logits' own dtype, or float64
PRECISIONS = ("float32", "logits", "float64")


def probabilities(logits: torch.Tensor, precision: str) -> torch.Tensor:
    """``softmax(logits)`` over the last dimension, in ``precision`` (:data:`PRECISIONS`).

    ``"float32"``: computed in float32 (float64 for float64 logits);
    ``"logits"``: ``torch.softmax`` in the logits' dtype, the result in that
    dtype; ``"float64"``: in float64. The mask token is not excluded: the
    authors' softmax runs over the whole vocabulary.
    """
    if precision == "logits":
        return torch.softmax(logits, dim=-1)
    if precision == "float64":
        return torch.softmax(logits.to(torch.float64), dim=-1)
    return torch.softmax(logits.to(reduction_dtype(logits.dtype)), dim=-1)


_precision = one_of(PRECISIONS)


def filtered(logits: torch.Tensor, top_k: int | None = None, top_p: float | None = None) -> torch.Tensor:
    """``logits`` outside the top-p nucleus, then outside the ``top_k`` best, set to the dtype's lowest value.

    Dream's ``top_p_logits`` then ``top_k_logits`` (``sample_tokens``), which
    it applies before every softmax, even at temperature 0 (its generation
    config takes ``top_k`` 50 from the model config of transformers 4).
    ``None`` (and ``top_p`` 1) filters nothing; ties with the ``top_k``-th
    value are kept.
    """
    lowest = torch.finfo(logits.dtype).min
    if top_p is not None and top_p < 1:
        ordered, order = torch.sort(logits, descending=True)
        drop = torch.cumsum(torch.softmax(ordered, dim=-1), dim=-1) > top_p
        drop[..., 1:] = drop[..., :-1].clone()
        drop[..., 0] = False
        logits = logits.masked_fill(torch.zeros_like(drop).scatter(-1, order, drop), lowest)
    if top_k is not None:
        kth = torch.topk(logits, min(top_k, logits.shape[-1])).values[..., -1:]
        logits = logits.masked_fill(logits < kth, lowest)
    return logits


def greedy(
    logits: torch.Tensor | Scores, exclude: int | None = None, generator: torch.Generator | None = None
) -> tuple[torch.Tensor, torch.Tensor]:
    """Argmax token (never ``exclude``) and its softmax probability (the reference's rule at temperature 0).

    Given :class:`~refusion.decoding.scores.Scores` it never materialises the logits
    (the fused LM-head path, :func:`refusion_kernels.lm_head_stats`).
    """
    return Scores.of(logits).greedy(exclude)


greedy.accepts_scores = True  # type: ignore[attr-defined]  # a marker read by sample_with


def token_probability(logits: torch.Tensor | Scores, tokens: torch.Tensor, precision: str = "float32") -> torch.Tensor:
    """Softmax probability of ``tokens`` (shape ``(n,)``) under ``logits`` (shape ``(n, vocab)``), in ``precision``
    (:func:`probabilities`; the default, float32 at least, never materialises a :class:`Scores`' logits)."""
    if precision == "float32":
        return Scores.of(logits).probability(tokens)
    x = logits.logits if isinstance(logits, Scores) else logits
    return probabilities(x, precision).gather(-1, tokens.to(x.device).unsqueeze(-1)).squeeze(-1)


@attrs.frozen
class Greedy:
    """The argmax token and its probability, computed the way a peer computes them (greedy drafting).

    ``precision`` (:data:`PRECISIONS`) is how the probability is computed:
    ``"float32"`` is :func:`greedy` (refusion's fused LM-head path);
    ``"logits"`` takes ``torch.softmax`` of the logits in their own dtype
    (LLaDA's ``generate``, Dream, ReFusion's reference; the confidence keeps
    that dtype, so bfloat16 confidences tie where theirs do); ``"float64"``
    in float64 (Fast-dLLM). ``argmax`` says what the token is the argmax of:
    the ``"logits"`` (ties to the lowest id), or the ``"probabilities"`` in
    ``precision`` (Dream's ``probs.max(-1)``: logits that round to the same
    half-precision probability tie, and the lowest id wins).
    ``confidence_top_k`` / ``confidence_top_p`` filter the logits before the
    softmax (:func:`filtered`), as Dream does at temperature 0. The mask
    token ``exclude`` is never chosen; it still counts in the softmax.
    """

    precision: str = attrs.field(default="float32", validator=_precision)
    argmax: str = attrs.field(default="logits", validator=one_of(("logits", "probabilities")))
    confidence_top_k: int | None = attrs.field(default=None, validator=optional(positive_int))
    confidence_top_p: float | None = attrs.field(default=None, validator=optional(probability))

    accepts_scores = True
    #: a row's token and confidence depend on that row's logits alone (drafts may be drawn for the rows read only)
    rowwise = True

    @property
    def fused(self) -> bool:
        """Whether this is :func:`greedy` itself (drafts may then be projected lazily, on the fused path)."""
        return (
            self.precision == "float32"
            and self.argmax == "logits"
            and self.confidence_top_k is None
            and self.confidence_top_p is None
        )

    def __call__(self, logits, exclude=None, generator=None):
        if self.fused:
            return greedy(logits, exclude)
        x = logits.logits if isinstance(logits, Scores) else logits
        p = probabilities(filtered(x, self.confidence_top_k, self.confidence_top_p), self.precision)
        ranked = x if self.argmax == "logits" else p
        if exclude is not None:
            ranked = ranked.index_fill(-1, torch.tensor([exclude], device=x.device), float("-inf"))
        tokens = ranked.argmax(-1)
        return tokens, p.gather(-1, tokens.unsqueeze(-1)).squeeze(-1)


def is_greedy(sampler: Sampler) -> bool:
    """True for samplers that take the argmax on refusion's fused path (no random draws, float32
    confidences): drafts may then be computed lazily."""
    return (
        sampler is greedy
        or (isinstance(sampler, Greedy) and sampler.fused)
        or (isinstance(sampler, Sampling) and sampler.temperature < 1e-4)
    )


def apply_sampler(
    sampler: Sampler,
    scores: torch.Tensor | Scores,
    exclude: int | None,
    generator: torch.Generator | None,
    *,
    positions: torch.Tensor | None = None,
    canvas_length: int | None = None,
    block: tuple[int, int] | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Call ``sampler`` with what it accepts: Scores if it says so, else full logits.

    A sampler whose ``draws_canvas`` attribute is true also receives the rows'
    absolute ``positions`` and the ``canvas_length`` (prompt plus region), to
    draw its noise for the whole canvas as LLaDA does; one whose
    ``draws_block`` attribute is true receives the ``positions`` and the
    model ``block`` ``(start, stop)`` that holds them, to draw for every row
    of the block as SDAR does.
    """
    if getattr(sampler, "draws_canvas", False) and positions is not None:
        logits = scores.logits if isinstance(scores, Scores) else scores
        return sampler(logits, exclude=exclude, generator=generator, positions=positions, canvas_length=canvas_length)
    if getattr(sampler, "draws_block", False) and positions is not None and block is not None:
        logits = scores.logits if isinstance(scores, Scores) else scores
        return sampler(logits, exclude=exclude, generator=generator, positions=positions, block=block)
    if getattr(sampler, "accepts_scores", False):
        return sampler(Scores.of(scores), exclude=exclude, generator=generator)
    return sampler(scores.logits if isinstance(scores, Scores) else scores, exclude=exclude, generator=generator)


def keep_top_k(logits: torch.Tensor, k: int) -> torch.Tensor:
    """``logits`` with every entry below the ``k``-th largest of its row set to ``-inf`` (ties with it kept)."""
    if k >= logits.shape[-1]:
        return logits
    kth = torch.topk(logits, k, dim=-1).values[..., -1:]
    return logits.masked_fill(logits < kth, float("-inf"))


def _temperature(instance, attribute, value):
    if not is_number(value) or value < 0:
        raise bad_value(attribute.name, value, "a finite number >= 0 (0 = greedy)")


def _top_k(instance, attribute, value):
    if value is not None and (not is_integer(value) or value < 1):
        raise bad_value(attribute.name, value, "None or an integer >= 1")


def _top_p(instance, attribute, value):
    if value is not None and (not is_number(value) or not 0 < value <= 1):
        raise bad_value(attribute.name, value, "None or a number in (0, 1]")


@attrs.frozen
class Sampling:
    """Temperature sampling with optional top-k and top-p (nucleus) filtering.

    ``temperature`` below 1e-4 is greedy (the fused kernel path). Otherwise
    the logits are divided by ``temperature``, filtered to the ``top_k`` best
    and to the smallest set whose probability reaches ``top_p``, and a token is
    drawn with the decode's generator (one uniform per row, drawn on the CPU
    generator, so results do not depend on the device); its confidence is its
    probability under that filtered, tempered distribution (Dream's
    convention), so a narrow filter makes every draft confident. The mask
    token is never drawn.
    """

    temperature: float = attrs.field(default=0.0, validator=_temperature)
    top_k: int | None = attrs.field(default=None, validator=_top_k)
    top_p: float | None = attrs.field(default=None, validator=_top_p)

    accepts_scores = True

    def __attrs_post_init__(self):
        if self.temperature < 1e-4:  # top_p 1 keeps every token: a neutral value, as OpenAI clients send it
            ignored = [
                name
                for name, value, neutral in (("top_k", self.top_k, None), ("top_p", self.top_p, 1))
                if value is not None and value != neutral
            ]
            if ignored:
                raise ConfigError(
                    f"`{ignored[0]}` has no effect at `temperature` {self.temperature} (greedy decoding takes the "
                    f"argmax); pass a `temperature` > 0 to sample, or drop `{ignored[0]}`.",
                    param=ignored[0],
                )

    def __call__(self, logits, exclude=None, generator=None):
        if self.temperature < 1e-4:
            return greedy(logits, exclude)
        if isinstance(logits, Scores):
            logits = logits.logits
        x = logits.float() / self.temperature
        if exclude is not None:
            x = x.index_fill(-1, torch.tensor([exclude], device=x.device), float("-inf"))
        if self.top_k is not None:
            x = keep_top_k(x, self.top_k)
        if self.top_p is not None and self.top_p < 1:
            ordered, order = torch.sort(x, dim=-1, descending=True)
            cumulative = torch.softmax(ordered, dim=-1).cumsum(-1)
            drop = cumulative - torch.softmax(ordered, dim=-1) >= self.top_p  # keep the first token that crosses
            x = x.scatter(-1, order, ordered.masked_fill(drop, float("-inf")))
        probs = torch.softmax(x, dim=-1)
        cdf = probs.cumsum(-1)
        u = torch.rand(probs.shape[:-1], generator=generator, dtype=torch.float64).to(probs.device)
        tokens = torch.searchsorted(cdf, (u * cdf[..., -1:].squeeze(-1).double()).to(cdf.dtype).unsqueeze(-1))
        tokens = tokens.squeeze(-1).clamp_max(probs.shape[-1] - 1)
        # a zero-probability token can only be hit on a cdf plateau's edge: step to the next kept token
        tokens = torch.where(probs.gather(-1, tokens.unsqueeze(-1)).squeeze(-1) > 0, tokens, probs.argmax(-1))
        return tokens, probs.gather(-1, tokens.unsqueeze(-1)).squeeze(-1)


@attrs.frozen
class GumbelMax:
    """LLaDA's sampling: the argmax of ``exp(logits) / (-log u) ** temperature`` (arXiv 2502.09992, ``generate.py``).

    ``u`` is uniform float64 noise drawn from the decode's generator for
    every position of the canvas and every vocabulary entry, shape
    ``(canvas_length, vocab)``, at every step (LLaDA's ``rand_like`` over its
    whole sequence), so a seeded decode draws exactly what LLaDA draws with
    the same generator; the rows of the planned ``positions`` are used. The
    computation is float64 as in LLaDA. The confidence is the softmax
    probability of the chosen token under the untempered logits (LLaDA's
    ``low_confidence``), computed in ``precision`` (:data:`PRECISIONS`:
    LLaDA's ``generate`` uses the logits' dtype, Fast-dLLM float64).
    ``temperature`` 0 is greedy (in ``precision``) and draws nothing. The
    mask token is never chosen.
    """

    temperature: float = attrs.field(default=0.0, validator=_temperature)
    precision: str = attrs.field(default="float32", validator=_precision)

    draws_canvas = True
    accepts_scores = True

    def __call__(self, logits, exclude=None, generator=None, positions=None, canvas_length=None):
        if self.temperature == 0:
            return Greedy(self.precision)(logits, exclude)
        if isinstance(logits, Scores):
            logits = logits.logits
        x = logits.to(torch.float64)
        if positions is None:  # no canvas known: draw for these rows only
            noise = torch.rand(x.shape, generator=generator, dtype=torch.float64)
        else:
            length = int(canvas_length) if canvas_length else int(positions.max()) + 1
            noise = torch.rand((length, x.shape[-1]), generator=generator, dtype=torch.float64)[positions.cpu()]
        noisy = x.exp() / (-torch.log(noise.to(x.device))) ** self.temperature
        if exclude is not None:
            noisy = noisy.index_fill(-1, torch.tensor([exclude], device=x.device), float("-inf"))
        tokens = noisy.argmax(-1)
        return tokens, token_probability(logits, tokens, self.precision)


def _top_k_off(instance, attribute, value):
    if not is_integer(value) or value < 0:
        raise bad_value(attribute.name, value, "an integer >= 0 (0 = no top-k filter)")


def _top_p_off(instance, attribute, value):
    if not is_number(value) or not 0 < value <= 1:
        raise bad_value(attribute.name, value, "a number in (0, 1] (1 = no top-p filter)")


@attrs.frozen
class BlockMultinomial:
    """SDAR's sampling (``block_diffusion_generate``): one multinomial draw per row of the model block.

    The logits are divided by ``temperature`` (unless it is 1), filtered to
    the ``top_k`` best (0: no filter) and then to the smallest set whose
    probability exceeds ``top_p`` (1: no filter), and each row draws its
    token with ``torch.multinomial``'s algorithm (the argmax of ``p / q``,
    ``q ~ Exp(1)``, for every vocabulary entry), for every row of the model
    block ``(start, stop)`` in order, from the decode's generator, so a seeded
    decode draws exactly what SDAR draws after ``torch.manual_seed`` with the
    same seed; the rows of the planned ``positions`` are used. The confidence
    is the drawn token's probability under that distribution, in the logits'
    dtype as SDAR computes it (bfloat16 confidences of a bfloat16 model,
    compared with SDAR's thresholds as SDAR compares them; ``precision``
    ``"float32"``: the logits in float32 first, as LLaDA 2.x's ``generate``
    does). The mask token is never drawn (SDAR may draw it; then the two
    differ). ``temperature`` 0 is greedy (SDAR divides by it and fails).
    """

    temperature: float = attrs.field(default=1.0, validator=_temperature)
    top_k: int = attrs.field(default=0, validator=_top_k_off)
    top_p: float = attrs.field(default=1.0, validator=_top_p_off)
    precision: str = attrs.field(default="logits", validator=_precision)

    draws_block = True
    accepts_scores = True

    def __call__(self, logits, exclude=None, generator=None, positions=None, block=None):
        if self.temperature == 0:
            return greedy(logits, exclude)
        if isinstance(logits, Scores):
            logits = logits.logits
        if self.precision != "logits":
            logits = logits.to(torch.float64 if self.precision == "float64" else reduction_dtype(logits.dtype))
        x = logits if self.temperature == 1.0 else logits / self.temperature
        if self.top_k > 0:
            x = keep_top_k(x, self.top_k)
        if self.top_p < 1.0:
            ordered, order = torch.sort(x, dim=-1, descending=True)
            drop = torch.softmax(ordered, dim=-1).cumsum(-1) > self.top_p
            drop[..., 1:] = drop[..., :-1].clone()
            drop[..., 0] = False
            x = x.masked_fill(torch.zeros_like(drop).scatter(-1, order, drop), float("-inf"))
        probs = torch.softmax(x, dim=-1)
        if positions is None or block is None:  # no block known: draw for these rows only
            race = torch.empty(probs.shape, dtype=probs.dtype).exponential_(1, generator=generator)
        else:
            start, stop = block
            race = torch.empty((stop - start, probs.shape[-1]), dtype=probs.dtype).exponential_(1, generator=generator)
            race = race[positions.cpu() - start]
        keys = probs / race.to(probs.device)
        if exclude is not None:
            keys = keys.index_fill(-1, torch.tensor([exclude], device=keys.device), -1.0)
        tokens = keys.argmax(-1)
        return tokens, probs.gather(-1, tokens.unsqueeze(-1)).squeeze(-1)


#: Samplers by name, for ``Decoder.from_names(sampler=..., temperature=...)``.
SAMPLERS = {"categorical": Sampling, "gumbel": GumbelMax, "block-multinomial": BlockMultinomial}
