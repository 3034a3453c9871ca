"""Independent restatements of the peers' published decoders, for the preset tests.

Written from the papers and the semantics of the public code (ML-GSAI/LLaDA
``generate.py``, NVlabs/Fast-dLLM ``llada/generate.py``, Dream's
``diffusion_generate``), not copied. They run a transformers network directly
on the whole sequence ``x`` (prompt + masks), batch 1. Differences on purpose,
all documented: random numbers come from a ``torch.Generator`` instead of the
global generator; the test models give the mask token a very low logit, so
that never drafting it (refusion's rule) changes nothing.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F


def _logits(net, x):
    return net(input_ids=x).logits


def llada_schedule(masks: int, steps: int) -> list[int]:
    """LLaDA's ``get_num_transfer_tokens`` for one row: ``masks // steps`` each, the remainder on the first steps."""
    counts = [masks // steps] * steps
    for i in range(masks % steps):
        counts[i] += 1
    return counts


def gumbel(logits, temperature, generator):
    """LLaDA's ``add_gumbel_noise``: ``exp(logits) / (-log u) ** temperature`` in float64 (identity at 0)."""
    if temperature == 0:
        return logits
    logits = logits.to(torch.float64)
    u = torch.rand(logits.shape, generator=generator, dtype=torch.float64)
    return logits.exp() / (-torch.log(u)) ** temperature


def llada(
    net,
    prompt,
    *,
    steps,
    gen_length,
    block_length,
    mask_id,
    temperature=0.0,
    cfg_scale=0.0,
    remasking="low_confidence",
    generator=None,
):
    """LLaDA's sampler: blocks left to right, ``steps // blocks`` steps each, top confidence (or random) per step."""
    x = torch.full((1, len(prompt) + gen_length), mask_id, dtype=torch.long)
    x[0, : len(prompt)] = torch.tensor(prompt)
    prompt_index = x != mask_id
    blocks = gen_length // block_length
    per_block = steps // blocks
    for b in range(blocks):
        lo, hi = len(prompt) + b * block_length, len(prompt) + (b + 1) * block_length
        counts = llada_schedule(int((x[0, lo:hi] == mask_id).sum()), per_block)
        for i in range(per_block):
            mask_index = x == mask_id
            if cfg_scale > 0:
                un = x.clone()
                un[prompt_index] = mask_id
                both = _logits(net, torch.cat([x, un]))
                cond, uncond = both[:1], both[1:]
                logits = uncond + (cfg_scale + 1) * (cond - uncond)
            else:
                logits = _logits(net, x)
            x0 = gumbel(logits, temperature, generator).argmax(-1)
            if remasking == "low_confidence":
                p = F.softmax(logits, dim=-1)
                x0_p = p.gather(-1, x0[..., None])[..., 0]
            else:
                x0_p = torch.rand(x0.shape, generator=generator).to(logits.dtype)
            x0_p[:, hi:] = -torch.inf
            x0 = torch.where(mask_index, x0, x)
            confidence = torch.where(mask_index, x0_p, torch.tensor(-torch.inf, dtype=x0_p.dtype))
            if counts[i]:
                chosen = _top(confidence[0], counts[i])
                x[0, chosen] = x0[0, chosen]
    return x[0, len(prompt) :].tolist()


def _top(values: torch.Tensor, k: int) -> torch.Tensor:
    """The ``k`` largest entries, equal values in position order (the tie rule refusion documents)."""
    return torch.sort(values, descending=True, stable=True).indices[:k]


def dream(net, prompt, *, steps, gen_length, mask_id, eps=1e-3, alg="maskgit_plus", generator=None):
    """Dream's greedy ``diffusion_generate`` (temperature 0): logits shifted by one, linear timestep schedule."""
    x = torch.full((1, len(prompt) + gen_length), mask_id, dtype=torch.long)
    x[0, : len(prompt)] = torch.tensor(prompt)
    timesteps = torch.linspace(1, eps, steps + 1)
    for i in range(steps):
        mask_index = x == mask_id
        logits = _logits(net, x)
        logits = torch.cat([logits[:, :1], logits[:, :-1]], dim=1)
        mask_logits = logits[mask_index]
        t, s = timesteps[i], timesteps[i + 1]
        probs = torch.softmax(mask_logits, dim=-1)
        confidence, x0 = probs.max(dim=-1)
        if alg == "origin":
            p_transfer = 1 - s / t if i < steps - 1 else 1
            take = torch.rand(x0.shape, generator=generator) < p_transfer
            row = torch.full_like(x0, mask_id)
            row[take] = x0[take]
            x[mask_index] = row
            continue
        if alg == "topk_margin":
            top2 = torch.sort(probs, dim=-1, descending=True).values
            confidence = top2[:, 0] - top2[:, 1]
        elif alg == "entropy":
            confidence = torch.sum(probs * torch.log(probs + 1e-10), dim=-1)
        masked = int(mask_index.sum())
        count = int(torch.tensor(float(masked)) * (1 - s / t)) if i < steps - 1 else masked
        full = torch.full(x.shape, -torch.inf, dtype=logits.dtype)
        full[mask_index] = confidence
        if count > 0:
            chosen = _top(full[0], count)
            proposal = torch.full_like(x, mask_id)
            proposal[mask_index] = x0
            x[0, chosen] = proposal[0, chosen]
    return x[0, len(prompt) :].tolist()


def fast_dllm(net, prompt, *, gen_length, block_length, mask_id, threshold, dual_cache=False):
    """Fast-dLLM's greedy threshold decoding (``generate`` / ``generate_with_dual_cache``).

    Per step of a block: the most confident mask is always unmasked, every
    other one whose confidence (float64 softmax) is ``>= threshold`` too. With
    ``dual_cache`` the block's first step is a full forward whose keys/values
    of everything but the block are kept; later steps feed the block only.
    """
    from transformers import DynamicCache

    x = torch.full((1, len(prompt) + gen_length), mask_id, dtype=torch.long)
    x[0, : len(prompt)] = torch.tensor(prompt)
    for b in range(gen_length // block_length):
        lo, hi = len(prompt) + b * block_length, len(prompt) + (b + 1) * block_length
        kept = None
        while bool((x[0, lo:hi] == mask_id).any()):
            if kept is None:
                cache = DynamicCache() if dual_cache else None
                logits = net(input_ids=x, cache=cache, use_cache=dual_cache).logits[0, lo:hi]
                if dual_cache:
                    kept = [
                        (
                            torch.cat([layer.keys[:, :, :lo], layer.keys[:, :, hi:]], 2),
                            torch.cat([layer.values[:, :, :lo], layer.values[:, :, hi:]], 2),
                        )
                        for layer in cache.layers
                    ]
            else:
                cache = DynamicCache(list(kept))
                ones = torch.ones(1, x.shape[1], dtype=torch.long)
                logits = net(
                    input_ids=x[:, lo:hi],
                    position_ids=torch.arange(lo, hi)[None],
                    attention_mask=ones,
                    cache=cache,
                    use_cache=True,
                ).logits[0]
            x0 = logits.argmax(-1)
            p = F.softmax(logits.to(torch.float64), dim=-1).gather(-1, x0[:, None])[:, 0]
            masked = x[0, lo:hi] == mask_id
            confidence = torch.where(masked, p, torch.tensor(-torch.inf, dtype=torch.float64))
            order = _top(confidence, int(masked.sum()))
            take = [int(order[0])] + [int(j) for j in order[1:] if confidence[j] >= threshold]
            x[0, lo + torch.tensor(take)] = x0[torch.tensor(take)]
    return x[0, len(prompt) :].tolist()


def cut_at_eos(tokens: list[int], eos: int) -> list[int]:
    """The answer up to and including the first EOS (how the peers' outputs are read)."""
    return tokens[: tokens.index(eos) + 1] if eos in tokens else tokens
