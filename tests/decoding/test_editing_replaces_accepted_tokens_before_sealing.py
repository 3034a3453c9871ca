"""The ``editing`` reviser (LLaDA 2.1's token-to-token editing): accepted tokens are replaced where the
forward's argmax differs with probability above ``editing_threshold``; edit-only passes follow a filled block.

Checked against a restatement of LLaDA 2.1's ``generate`` loop (greedy, over the whole canvas as a
bidirectional LLaDA checkpoint sees it); the comparison with the authors' own code on their MoE class comes
with LLaDA 2.x support.
"""

from __future__ import annotations

import functools
from pathlib import Path

import pytest
import torch

import refusion
from refusion.errors import ConfigError
from refusion.strategies.base import RevisionView
from refusion.strategies.revisers.editing import EditingReviser

LLADA = Path(__file__).resolve().parents[1] / "fixtures" / "peers" / "llada"
BLOCK, GEN = 8, 24


@functools.cache
def model():
    return refusion.load_model(str(LLADA))


def restated(net, prompt, threshold, editing_threshold, max_post_steps, mask):
    """LLaDA 2.1's loop: per block (from position 0), until no mask is left and a pass edits nothing (at most
    ``max_post_steps`` passes after the last mask): masks above ``threshold`` (else the most confident one)
    take their argmax; earlier tokens whose argmax differs with probability above ``editing_threshold`` are
    replaced. Returns the answer (cut after the first EOS later) and the forwards."""
    p = len(prompt)
    x = torch.full((1, p + GEN), mask, dtype=torch.long)
    x[0, :p] = torch.tensor(prompt)
    forwards = 0
    for b in range(p // BLOCK, -(-(p + GEN) // BLOCK)):
        s, e = max(b * BLOCK, p), min((b + 1) * BLOCK, p + GEN)
        post = 0
        while True:
            old = x[0, s:e].clone()
            active = old == mask
            post += int(not active.any())
            if post > max_post_steps:
                break
            with torch.no_grad():
                logits = net(x).logits[0, s:e].float()
            forwards += 1
            confidence, x0 = torch.softmax(logits, -1).max(-1)
            transfer = torch.zeros_like(active)
            if active.any():
                c = torch.where(active, confidence, -torch.inf)
                high = (c > threshold) & active
                if high.any():
                    transfer = high
                else:
                    transfer[torch.topk(c, 1).indices] = True
            edit = ~active & (confidence > editing_threshold) & (x0 != old)
            x[0, s:e][transfer | edit] = x0[transfer | edit]
            if not active.any() and not edit.any():
                break
    return x[0, p:].tolist(), forwards


def decode(prompt, threshold, reviser="editing", **params):
    return refusion.generate(
        prompt,
        model(),
        partitioner="semi-ar",
        selector="threshold",
        infiller="draft",
        reorderer="no-cache",
        reviser=reviser,
        block_length=BLOCK,
        align="absolute",
        slot_size=1,
        slot_threshold=threshold,
        stop_at_eos=False,
        gen_length=GEN,
        record=True,
        **params,
    )


def cut(tokens, eos):
    hit = next((i for i, t in enumerate(tokens) if t in eos), None)
    return tokens if hit is None else tokens[: hit + 1]


@pytest.mark.parametrize(
    "prompt, threshold, editing_threshold, max_post_steps",
    [
        ([4, *range(40, 52)], 0.3, 0.0, 4),
        ([4, *range(40, 52)], 0.3, 0.3, 4),
        ([4, 60, 61], 0.9, 0.5, 2),
        ([4, *range(20, 35)], 0.5, 0.2, 16),
        ([4, *range(20, 35)], 0.5, 0.2, 0),
    ],
)
def test_it_decodes_as_llada_2_1s_loop(prompt, threshold, editing_threshold, max_post_steps):
    result = decode(prompt, threshold, editing_threshold=editing_threshold, max_post_steps=max_post_steps)
    tokens, forwards = restated(
        model().model, prompt, threshold, editing_threshold, max_post_steps, model().mask_token_id
    )
    assert result.tokens.tolist() == cut(tokens, model().eos_token_ids)
    assert result.forwards == forwards


def test_without_the_edits_the_tokens_differ():
    prompt = [4, *range(40, 52)]
    edited = decode(prompt, 0.3, editing_threshold=0.3, max_post_steps=4)
    plain = decode(prompt, 0.3, reviser="none")
    assert edited.tokens.tolist() != plain.tokens.tolist()
    assert sum(len(r.revised) for r in edited.iterations) > 0
    passes = [r for r in edited.iterations if not r.planned]  # the edit-only passes after a block was filled
    assert passes and all(r.forwards == 1 for r in passes)


def view(tokens, predicted, probability, now, mask=3):
    n = len(tokens)
    return RevisionView(
        offsets=torch.arange(n),
        tokens=torch.tensor(tokens),
        accepted_now=torch.tensor(now),
        verified=None,
        masked=0,
        block=0,
        block_start=0,
        block_stop=n,
        predicted=torch.tensor(predicted),
        predicted_probability=torch.tensor(probability),
        mask_token_id=mask,
    )


def test_the_rule_on_a_hand_made_view():
    reviser = EditingReviser(editing_threshold=0.5)
    revision = reviser.revise(
        view([10, 11, 12, 13, 14], [10, 20, 21, 3, 22], [0.9, 0.9, 0.4, 0.8, 0.9], [False, False, False, False, True])
    )
    # 0: same token; 1: replaced; 2: not confident enough; 3: its argmax is the mask: masked again; 4: accepted now
    assert revision.replace == {1: 20} and revision.remask == (3,)
    assert reviser.revise(view([10], [10], [0.99], [False])) is None


def test_it_needs_a_bidirectional_model():
    with pytest.raises(ConfigError, match="editing"):
        refusion.generate("rev abc=", refusion.load_model(), reviser="editing", gen_length=8)
