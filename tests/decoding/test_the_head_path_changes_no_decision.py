"""Which LM-head path runs changes no decision: the fused statistics of the rows a decoder reads equal those of the
plain projection of the whole forward (what the network's own head computes), bit for bit, ties included.

Was: the fused path multiplied only the rows read (on CPUs a float32 matrix product of 1-3 rows runs another
kernel than one of 4 or more) and reduced large vocabularies in chunks (another rounding of the log-sum-exp), so a
near tie between two slots' confidences could flip with the path (a ReFusion decode at gen 256 diverged from the
reference at token 74 with the fused statistics on, and matched with them off).
"""

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from refusion.decoding.scores import Scores, project
from refusion.models.head import LMHead


def near_tie_head(vocab: int, dim: int, dtype: torch.dtype, seed: int, twins: int) -> tuple[LMHead, torch.Tensor]:
    """A head whose rows come in nearly equal pairs (so logits nearly tie), and hidden states for 24 rows."""
    g = torch.Generator().manual_seed(seed)
    weight = torch.randn(vocab, dim, generator=g)
    for i in range(0, min(twins, vocab - 1), 2):  # a twin: the same row, nudged by less than the dtype's step
        weight[i + 1] = weight[i] + torch.randn(dim, generator=g) * 1e-7
    hidden = torch.randn(24, dim, generator=g) * 3
    hidden[1::3] = hidden[0::3][: len(hidden[1::3])]  # repeated rows: exactly tied confidences between rows
    return LMHead(weight.to(dtype)), hidden.to(dtype)


@settings(max_examples=25, deadline=None)
@given(
    seed=st.integers(0, 10_000),
    dtype=st.sampled_from([torch.float32, torch.bfloat16, torch.float16]),
    vocab=st.sampled_from([97, 1000, 40_000]),
    rows=st.lists(st.integers(0, 23), min_size=1, max_size=5),
    exclude=st.one_of(st.none(), st.integers(0, 3)),
)
def test_fused_statistics_of_some_rows_equal_the_plain_projection_of_all(seed, dtype, vocab, rows, exclude):
    head, hidden = near_tie_head(vocab, 48, dtype, seed, twins=64)
    plain = Scores(logits=torch.nn.functional.linear(hidden, head.weight))  # the network's head, all 24 rows
    index = torch.tensor(rows)
    fused = Scores(hidden=hidden, head=head)[index]
    tokens, prob = fused.greedy(exclude)
    want_tokens, want_prob = plain[index].greedy(exclude)
    assert torch.equal(tokens, want_tokens) and torch.equal(prob, want_prob)
    targets = (index * 13) % vocab
    assert torch.equal(fused.probability(targets), plain[index].probability(targets))
    batched = Scores(hidden=hidden, head=head)  # the batched pass the decoder makes for several sequences
    project([(batched, index, torch.arange(24) % vocab)], exclude)
    assert torch.equal(batched[index].greedy(exclude)[1], want_prob)
    assert torch.equal(batched[index].probability(targets), plain[index].probability(targets))


def test_equal_logits_go_to_the_lowest_id_on_both_paths():
    weight = torch.randn(50, 16)
    weight[31] = weight[7]  # an exact tie between ids 7 and 31
    hidden = weight[7:8] * 5
    head = LMHead(weight)
    assert Scores(hidden=hidden, head=head).greedy()[0].item() == 7 == Scores(logits=head.logits(hidden)).greedy()[0]


def test_forwards_too_small_for_the_fused_path_give_the_network_s_own_logits():
    from tests.support.helpers import tiny

    model = tiny(vocab=40, seed=2, scale=4.0)
    if model.head is None:
        pytest.skip("no separable head")
    ids, positions, mask = torch.tensor([[5]]), torch.tensor([[0]]), torch.ones(1, 1, dtype=torch.long)
    with torch.no_grad():
        scores = model.scores(ids, positions, mask, None)
        assert torch.equal(
            scores.logits[0],
            model.model(input_ids=ids, position_ids=positions, attention_mask=mask).logits[0].to(scores.logits.dtype),
        )
