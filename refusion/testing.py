"""Helpers for testing refusion and plugins written for it.

* :func:`tiny_model` - a tiny random Qwen3 behind the HF adapter (no download).
* :class:`ScriptedModel` - a fake causal diffusion LM whose logits come from a
  Python rule, to check a strategy's rule by hand.
* :func:`check_part` - a conformance check a plugin author can run on a part:
  it decodes with the part on small models and checks termination,
  completeness and the part's contract.
"""

from __future__ import annotations

import functools
import random
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import torch

from refusion.models.base import ModelAdapter, ModelCapabilities

#: ``rule(seen, position, token) -> logits``: ``seen`` maps position -> token for
#: every token the query attends to (context and earlier fed tokens, itself
#: included); ``token`` is the fed token (the mask id for a mask).
Rule = Callable[[Mapping[int, int], int, int], Sequence[float]]


def tiny_model(**kwargs: Any):
    """``HFCausalLM`` around :func:`refusion.models.tiny.tiny_qwen3` (same keyword arguments)."""
    from refusion.models.hf import HFCausalLM
    from refusion.models.tiny import tiny_qwen3

    return HFCausalLM(tiny_qwen3(**kwargs))


class ScriptedModel(ModelAdapter):
    """A fake model whose output at each fed token is ``rule(seen, position, token)``.

    Causal by default; with ``causal=False`` every query sees every visible
    token (a bidirectional, LLaDA-style model; ``logit_shift=1`` for Dream-style).

    It keeps a real transformers ``DynamicCache`` (one layer, one head, width
    one) whose "keys" are token ids and "values" positions, so every cache
    operation of the decoder runs exactly as with a real model. ``calls``
    records ``(positions, tokens)`` of every query row, for assertions.
    """

    name = "scripted"
    capabilities = ModelCapabilities(causal=True, logit_shift=0, kv_cache=True)

    def __init__(
        self,
        rule: Rule,
        *,
        vocab_size: int,
        mask_token_id: int,
        eos_token_id: int | None = None,
        max_positions: int | None = None,
        causal: bool = True,
        logit_shift: int = 0,
    ):
        self.rule = rule
        self.capabilities = ModelCapabilities(causal=causal, logit_shift=logit_shift, kv_cache=True)
        self.vocab_size = vocab_size
        self.mask_token_id = mask_token_id
        self.eos_token_ids = frozenset() if eos_token_id is None else frozenset({eos_token_id})
        self.max_positions = max_positions
        self.tokenizer = None
        self.forwards = 0
        self.calls: list[list[tuple[list[int], list[int]]]] = []

    @property
    def device(self) -> torch.device:
        return torch.device("cpu")

    def new_cache(self):
        from transformers import DynamicCache

        return DynamicCache()

    def kv_shape(self):
        return 1, 1, 1, torch.float64

    def forward(self, input_ids, position_ids, attention_mask, cache, logits_to_keep=0):
        self.forwards += 1
        batch, q = input_ids.shape
        new_keys = input_ids.double()[:, None, :, None]
        new_values = position_ids.double()[:, None, :, None]
        if cache is None:
            keys, values = new_keys, new_values
        else:
            keys, values = cache.update(new_keys, new_values, 0)  # every visible entry, the fed tokens last
        tokens, positions = keys[:, 0, :, 0].long(), values[:, 0, :, 0].long()
        total = tokens.shape[1]
        past = total - q
        if attention_mask.dim() == 2 and not self.capabilities.causal:
            visible = attention_mask[:, None, :].bool().expand(batch, q, total)
        elif attention_mask.dim() == 2:  # padding mask plus causal order
            causal = torch.arange(total)[None, :] <= (past + torch.arange(q))[:, None]
            visible = attention_mask[:, None, :].bool() & causal[None]
        else:
            visible = attention_mask[:, 0].bool()
        logits = torch.empty(batch, q, self.vocab_size, dtype=torch.float64)
        record = []
        for b in range(batch):
            for i in range(q):
                cols = visible[b, i].nonzero().flatten().tolist()
                seen = {int(positions[b, j]): int(tokens[b, j]) for j in cols if j < past}
                seen.update({int(positions[b, j]): int(tokens[b, j]) for j in cols if j >= past})
                row = self.rule(seen, int(position_ids[b, i]), int(input_ids[b, i]))
                logits[b, i] = torch.as_tensor(row, dtype=torch.float64)
            record.append((position_ids[b].tolist(), input_ids[b].tolist()))
        self.calls.append(record)
        return logits[:, -logits_to_keep:] if logits_to_keep else logits


def one_hot_logits(vocab_size: int, token: int, prob: float) -> list[float]:
    """Logits under which ``token`` has probability ``prob`` and the rest share ``1 - prob`` evenly."""
    import math

    rest = (1.0 - prob) / (vocab_size - 1)
    return [math.log(prob) if v == token else math.log(max(rest, 1e-300)) for v in range(vocab_size)]


def check_part(part: Any, *, trials: int = 6, seed: int = 0) -> None:
    """Decode with ``part`` in place of the paper's part of its kind; raise AssertionError on a broken contract.

    Parts that need a bidirectional model are checked on one, parts that need a block-diffusion model
    (``requires`` a ``block_length``) on one, in its blocks. Checks, over
    random tiny models, prompts and lengths: decoding terminates
    within one iteration per slot, every position up to the end is committed
    exactly once, no mask token is left, and output positions are a prefix of
    the generation region (cut only at EOS).
    """
    from refusion.decoding.decoder import Decoder
    from refusion.models.block import tiny_block_diffusion
    from refusion.models.mdm import tiny_bidirectional

    rng = random.Random(seed)
    causal = getattr(part, "requires", {}).get("causal", True)
    blocks = "block_length" in getattr(part, "requires", {})
    parts = dict(
        partitioner="semi-ar" if blocks else "fixed",
        selector="threshold",
        infiller="parallel-ar" if causal else "draft",
        reorderer="commit-order",
    )
    parts[part.kind] = part
    for trial in range(trials):
        vocab = rng.choice([12, 24])
        eos = rng.choice([None, 2])
        build = tiny_model if causal else tiny_bidirectional
        if blocks:
            build = functools.partial(tiny_block_diffusion, block_length=4, layout="absolute")
        model = build(vocab_size=vocab, seed=seed * 1000 + trial, logit_scale=rng.choice([4.0, 16.0]), eos_token_id=eos)
        params = {}
        if blocks and part.kind != "partitioner":
            params = dict(slot_size=1, block_length=4, align="absolute")
        elif part.kind != "partitioner":
            params = dict(slot_size=rng.choice([1, 2, 4]), serial_num_blocks=rng.choice([1, 2]))
        decoder = Decoder.from_names(**parts, **params)
        prompt = [rng.randrange(vocab - 1) for _ in range(rng.randint(1, 5))]
        gen_length = rng.choice([4, 8, 12])
        try:
            partition = decoder.partitioner.partition(gen_length)
        except ValueError:
            continue
        result = decoder.decode(model, prompt, gen_length, record=True)
        check_result(result, model)
        assert result.num_iterations <= len(partition.slots), "more iterations than slots"


def check_result(result: Any, model: ModelAdapter) -> None:
    """Completeness invariants of a :class:`~refusion.decoding.types.DecodeResult` (decoded with ``record=True``)."""
    tokens = result.tokens
    g = result.partition.answer_length or result.partition.gen_length  # a region padded past the answer is cut
    assert 1 <= len(tokens) <= g, f"{len(tokens)} tokens for a region of {g}"
    assert not bool((tokens == model.mask_token_id).any()), "a mask token was left in the output"
    assert bool((result.commit_step[: len(tokens)] >= 0).all()), "a position before the end was never committed"
    assert len(result.iterations) == result.num_iterations, "decode with record=True to check a result"
    committed = sum(n for step in result.iterations for _, n in step.committed)
    assert committed >= len(tokens), "fewer tokens committed than returned"
    slots = [s for step in result.iterations for s, _ in step.committed]
    assert len(slots) == len(set(slots)), "a slot was committed twice"
    assert not any(int(t) in model.eos_token_ids for t in tokens[:-1]), "tokens after an EOS were returned"
    if len(tokens) < g:
        assert int(tokens[-1]) in model.eos_token_ids, "the answer stops early without an EOS"
