"""The LM head applied only where read: fused statistics equal the full logits' argmax and softmax."""

import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st

from refusion.decoding.scores import Scores, project
from refusion.models.head import LMHead, find_head
from tests.support.helpers import tiny

pytest.importorskip("triton")

from refusion_kernels.lm_head import _lm_head_triton, lm_head_stats_reference


def full_stats(hidden, weight, bias, exclude, temperature):
    logits = torch.nn.functional.linear(hidden, weight, bias).to(torch.float64) / temperature
    lse = torch.logsumexp(logits, -1)
    ranked = logits.clone()
    if exclude is not None:
        ranked[:, exclude] = float("-inf")
    best, tokens = ranked.max(-1)
    return tokens, best, lse


@given(
    rows=st.integers(1, 9),
    dim=st.sampled_from([8, 20, 48]),
    vocab=st.sampled_from([5, 33, 257, 1000]),
    exclude=st.one_of(st.none(), st.integers(0, 4)),
    temperature=st.sampled_from([1.0, 0.5, 1.7]),
    chunk=st.sampled_from([16, 100, 4096]),
    bias=st.booleans(),
    seed=st.integers(0, 999),
)
def test_grouped_torch_path_equals_full_logits(rows, dim, vocab, exclude, temperature, chunk, bias, seed):
    g = torch.Generator().manual_seed(seed)
    hidden, weight = torch.randn(rows, dim, generator=g), torch.randn(vocab, dim, generator=g)
    b = torch.randn(vocab, generator=g) if bias else None
    tokens, best, lse = lm_head_stats_reference(hidden, weight, b, exclude, temperature, chunk=chunk)
    want_tokens, want_best, want_lse = full_stats(hidden, weight, b, exclude, temperature)
    assert torch.equal(tokens, want_tokens)
    torch.testing.assert_close(best.double(), want_best, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(lse.double(), want_lse, rtol=1e-5, atol=1e-5)
    argmax_only = lm_head_stats_reference(hidden, weight, b, exclude, temperature, chunk=chunk, lse=False)
    assert torch.equal(argmax_only[0], tokens) and torch.equal(argmax_only[1], best) and argmax_only[2] is None


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("exclude, temperature", [(None, 1.0), (3, 1.0), (0, 0.7)])
def test_triton_kernel_equals_the_torch_path(dtype, exclude, temperature):
    g = torch.Generator().manual_seed(7)
    hidden = (torch.randn(19, 40, generator=g)).to(dtype)
    weight = (torch.randn(300, 40, generator=g) * 0.5).to(dtype)
    bias = torch.randn(300, generator=g).to(dtype)
    tokens, best, lse = _lm_head_triton(hidden, weight, bias, exclude, temperature)
    ref_tokens, ref_best, ref_lse = lm_head_stats_reference(hidden, weight, bias, exclude, temperature)
    tolerance = 2e-2 if dtype == torch.bfloat16 else 1e-4
    targets = torch.arange(19) * 7 % 300
    assert torch.equal(_lm_head_triton(hidden, weight, bias, exclude, temperature, targets)[0], tokens)
    torch.testing.assert_close(
        _lm_head_triton(hidden, weight, bias, exclude, temperature, targets)[3].float(),
        lm_head_stats_reference(hidden, weight, bias, exclude, temperature, targets=targets)[3].float(),
        rtol=tolerance,
        atol=tolerance,
    )
    picked = torch.nn.functional.linear(hidden.float(), weight.float(), bias.float()).gather(1, tokens[:, None])
    ref_picked = torch.nn.functional.linear(hidden.float(), weight.float(), bias.float()).gather(1, ref_tokens[:, None])
    torch.testing.assert_close(picked, ref_picked, rtol=tolerance, atol=tolerance)  # ties may pick another id
    torch.testing.assert_close(lse.float(), ref_lse.float(), rtol=tolerance, atol=tolerance)
    torch.testing.assert_close(best.float(), ref_best.float(), rtol=tolerance, atol=tolerance)
    if exclude is not None:
        assert not bool((tokens == exclude).any())


def test_scores_from_hidden_states_agree_with_materialised_logits():
    model = tiny(vocab=40, seed=2, scale=4.0)
    backbone, head = find_head(model.model)
    ids = torch.tensor([[1, 5, 7, 9, 2]])
    with torch.no_grad():
        hidden = backbone(input_ids=ids).last_hidden_state[0]
        logits = model.model(input_ids=ids).logits[0]
    lazy, full = Scores(hidden=hidden, head=head), Scores(logits=logits)
    torch.testing.assert_close(lazy.logits, logits)
    for exclude in (None, 39):
        assert torch.equal(lazy.greedy(exclude)[0], full.greedy(exclude)[0])
        assert torch.equal(lazy.argmax(exclude), full.greedy(exclude)[0])
        assert torch.equal(full.argmax(exclude), full.greedy(exclude)[0])
        torch.testing.assert_close(lazy.greedy(exclude)[1], full.greedy(exclude)[1])
    tokens = torch.tensor([3, 4, 5, 6, 7])
    torch.testing.assert_close(lazy.probability(tokens), full.probability(tokens))
    torch.testing.assert_close(lazy[1:3].probability(tokens[1:3]), full.probability(tokens)[1:3])


def test_one_projection_serves_many_scores_and_is_cached():
    g = torch.Generator().manual_seed(0)
    head = LMHead(torch.randn(50, 16, generator=g, dtype=torch.float64))
    passes = []
    original = head.stats
    head.stats = lambda hidden, *a, **k: passes.append(hidden.shape[0]) or original(hidden, *a, **k)
    a = Scores(hidden=torch.randn(6, 16, generator=g, dtype=torch.float64), head=head)
    b = Scores(hidden=torch.randn(4, 16, generator=g, dtype=torch.float64), head=head)
    want_a, want_b = Scores(logits=head.logits(a.hidden)).greedy(7), Scores(logits=head.logits(b.hidden)).greedy(7)
    project([(a, slice(None)), (b, torch.tensor([0, 2, 3]))], exclude=7)
    assert passes == [9]  # one pass over both sequences' rows
    assert torch.equal(a.greedy(7)[0], want_a[0]) and passes == [9]  # cached: no new pass
    assert torch.equal(b[2:].greedy(7)[0], want_b[0][2:]) and passes == [9]
    torch.testing.assert_close(b[[0, 2]].greedy(7)[1], want_b[1][[0, 2]])
    project([(a, slice(0, 3))], exclude=7)
    assert passes == [9]  # already known
    b.greedy(7)  # row 1 was never projected: the whole Scores is computed on its own
    assert passes == [9, 4]


def test_heads_that_post_process_logits_are_not_separated():
    model = tiny(vocab=16)
    model.model.config.final_logit_softcapping = 30.0
    assert find_head(model.model) is None
    assert model.head is None  # the adapter falls back to the network's own logits


def test_logits_far_below_the_maximum_leave_the_statistics_unchanged():
    """Raising logits more than 80 below a row's maximum (to keep float32 exp fast) changes no argmax or lse."""
    from refusion_kernels.underflow import floor_for_exp

    g = torch.Generator().manual_seed(0)
    x = torch.randn(6, 5000, generator=g) * 60  # spreads of hundreds, as a trained head's logits have
    x[0, 7] = float("-inf")
    x[1] = float("-inf")  # a row that is all -inf stays so
    floored = floor_for_exp(x)
    assert torch.equal(floored.argmax(-1), x.argmax(-1))
    assert torch.equal(floored.amax(-1), x.amax(-1))
    assert torch.equal(torch.logsumexp(floored, -1), torch.logsumexp(x, -1))
    assert floor_for_exp(x.double()) is not None and torch.equal(floor_for_exp(x.double()), x.double())
    w = torch.randn(5000, 16, generator=g) * 8
    h = torch.randn(5, 16, generator=g) * 8
    logits = h @ w.T
    for exclude in (None, int(logits[0].argmax())):
        tokens, best, lse = lm_head_stats_reference(h, w, exclude=exclude)
        ranked = logits if exclude is None else logits.index_fill(-1, torch.tensor([exclude]), float("-inf"))
        assert torch.equal(tokens, ranked.argmax(-1))
        torch.testing.assert_close(lse, torch.logsumexp(logits, -1), rtol=1e-6, atol=1e-5)
        grouped = lm_head_stats_reference(h, w, exclude=exclude, chunk=1024)
        assert all(torch.equal(a, b) for a, b in zip(grouped, (tokens, best, lse)))  # rows reduced alike


@pytest.mark.parametrize("exclude", [None, 5])
def test_triton_kernel_ranks_the_logits_rounded_to_the_weight_dtype_as_the_models_own_head(exclude):
    """bf16 logits tie often: the kernel must rank the head's own (rounded) logits, ties to the lowest id.

    Integer-valued weights make every sum exact in float32 whatever its order, so the only difference left
    is rounding each logit to bf16 (which the model's head does and the kernel must do too)."""
    g = torch.Generator().manual_seed(3)
    hidden = torch.randint(-8, 9, (40, 64), generator=g).to(torch.bfloat16)
    weight = torch.randint(-8, 9, (3000, 64), generator=g).to(torch.bfloat16)  # three vocabulary splits
    tokens, best, lse = _lm_head_triton(hidden, weight, None, exclude, 1.0)
    logits = torch.nn.functional.linear(hidden.float(), weight.float()).to(torch.bfloat16).float()  # exact, rounded
    ranked = logits if exclude is None else logits.index_fill(-1, torch.tensor([exclude]), float("-inf"))
    assert torch.equal(tokens, ranked.argmax(-1))
    assert torch.equal(best, ranked.max(-1).values)
    torch.testing.assert_close(lse, torch.logsumexp(logits, -1), rtol=1e-6, atol=1e-5)
    ref_tokens, ref_best, _ = lm_head_stats_reference(hidden, weight, None, exclude)
    assert torch.equal(tokens, ref_tokens) and torch.equal(best, ref_best)
    targets = torch.arange(40) * 71 % 3000  # the targets' logits from the same pass, across the splits
    picked = _lm_head_triton(hidden, weight, None, exclude, 1.0, targets)[3]
    assert torch.equal(picked, logits.gather(1, targets[:, None])[:, 0])
