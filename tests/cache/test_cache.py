"""The KV-cache operations on every causal engine: context extends, branch extends, appends and invalidation."""

import pytest
import torch

from refusion.decoding.protocol import Branch, Extend, ModelCall
from refusion.engines.branch import BranchEngine
from refusion.engines.repeat import RepeatEngine
from tests.support.helpers import tiny


def full_logits(adapter, tokens, positions):
    ids, pos = torch.tensor([tokens]), torch.tensor([positions])
    with torch.no_grad():
        return adapter.model(input_ids=ids, position_ids=pos, attention_mask=torch.ones_like(ids)).logits[0]


@pytest.fixture(params=["repeat", "branch"])
def setup(request):
    adapter = tiny(vocab=20, seed=3, scale=4.0)
    engine = {"repeat": RepeatEngine, "branch": BranchEngine}[request.param](adapter)
    state = engine.admit(torch.tensor([1, 2, 3, 4]), 16)
    return adapter, state.context, Run(engine, state)


class Run:
    """One sequence's calls on an engine, as the tests below issue them."""

    def __init__(self, engine, state):
        self.engine, self.state = engine, state

    def run(self, call):
        return self.engine.run({self.state: call})[self.state]

    def flush(self):
        if hasattr(self.engine, "flush"):  # the repeat engine encodes pending entries on their own
            self.engine.flush(self.state)


def test_context_extend_prefills_pending_and_crops_back(setup):
    adapter, cache, ex = setup
    (out,) = ex.run(ModelCall.of(Extend(Branch(), [5, 6], [9, 7])))
    assert cache.encoded == 4 and len(cache.store) == 4
    ref = full_logits(adapter, [1, 2, 3, 4, 5, 6], [0, 1, 2, 3, 9, 7])
    torch.testing.assert_close(out.logits, ref[4:])
    torch.testing.assert_close(cache.last_scores.logits[0], ref[3])
    assert len(out.kv) == 2 and out.kv.data.shape[:2] == (2, 2)


def test_branch_extends_see_the_context_and_their_own_branch_only(setup):
    adapter, cache, ex = setup
    ex.flush()
    (a,) = ex.run(ModelCall.of(Extend(Branch(), [7, 8, 9], [10, 11, 12])))
    branch = Branch().extended(a, 2)
    outs = ex.run(ModelCall.of(Extend(branch, [5], [13]), Extend(Branch(), [6, 6], [20, 21])))
    ref_branch = full_logits(adapter, [1, 2, 3, 4, 7, 8, 5], [0, 1, 2, 3, 10, 11, 13])
    ref_plain = full_logits(adapter, [1, 2, 3, 4, 6, 6], [0, 1, 2, 3, 20, 21])
    torch.testing.assert_close(outs[0].logits, ref_branch[6:])
    torch.testing.assert_close(outs[1].logits, ref_plain[4:])
    assert len(cache.store) == 4  # the context cache is untouched


def test_appended_kv_is_read_back(setup):
    adapter, cache, ex = setup
    (out,) = ex.run(ModelCall.of(Extend(Branch(), [7, 8], [4, 5])))
    cache.append(torch.tensor([7, 8]), torch.tensor([4, 5]), out.kv)
    (probe,) = ex.run(ModelCall.of(Extend(Branch(), [9], [6])))
    torch.testing.assert_close(probe.logits, full_logits(adapter, [1, 2, 3, 4, 7, 8, 9], list(range(7)))[6:])
    assert cache.chunks[-1].stop == 6


def test_partial_kv_leaves_a_pending_tail_and_invalidate_reencodes(setup):
    adapter, cache, ex = setup
    (out,) = ex.run(ModelCall.of(Extend(Branch(), [7, 8], [4, 5])))
    cache.append(torch.tensor([7, 8]), torch.tensor([4, 5]), out.kv[:1])
    assert cache.pending == 1
    cache.invalidate(2)
    assert cache.encoded == 2 and cache.pending == 4
    (probe,) = ex.run(ModelCall.of(Extend(Branch(), [9], [6])))
    torch.testing.assert_close(probe.logits, full_logits(adapter, [1, 2, 3, 4, 7, 8, 9], list(range(7)))[6:])


def test_branch_extended_checks_its_arguments(setup):
    _, _, ex = setup
    (out,) = ex.run(ModelCall.of(Extend(Branch(), [7, 8], [4, 5])))
    other = Branch().extended(out, 1)
    with pytest.raises(ValueError, match="does not extend this branch"):
        other.extended(out, 1)
    with pytest.raises(ValueError, match="`n` must be in \\[0, 2\\]"):
        out.extend.parent.extended(out, 3)


def test_extend_validation():
    with pytest.raises(ValueError, match="same length"):
        Extend(Branch(), [1, 2], [3])
    with pytest.raises(ValueError, match="must not be empty"):
        Extend(Branch(), [], [])
