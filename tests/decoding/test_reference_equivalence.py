"""The paper configuration reproduces the reference algorithm token for token.

``tests/support/reference_refusion.py`` restates the reference decoder plainly (batch 1,
lock-step branches, batch-repeated cache). The library decodes with its own
parts (independent branches, branch handles, commit-order reorderer).
"""

from hypothesis import given
from hypothesis import strategies as st

from refusion.decoding.decoder import Decoder
from refusion.testing import ScriptedModel, one_hot_logits
from tests.support.helpers import layouts, model_setups
from tests.support.reference_refusion import reference_refusion

thresholds = st.floats(0.0, 1.0, allow_nan=False)


@given(setup=model_setups(eos_choices=(None, 2, 2)), layout=layouts(), slot_t=thresholds, token_t=thresholds)
def test_paper_configuration_matches_reference(setup, layout, slot_t, token_t):
    adapter, prompt = setup
    slot, blocks, gen_length = layout
    gen_length = -(-gen_length // slot) * slot  # the reference rounds up to whole slots; refusion honours a length
    decoder = Decoder.from_names(
        slot_size=slot, serial_num_blocks=blocks, slot_threshold=slot_t, token_threshold=token_t
    )
    ours = decoder.decode(adapter, prompt, gen_length, record=True).tokens.tolist()
    eos = next(iter(adapter.eos_token_ids), None)
    ref = reference_refusion(
        adapter.model,
        prompt,
        gen_length,
        mask_id=adapter.mask_token_id,
        eos_id=eos,
        slot_size=slot,
        serial_num_blocks=blocks,
        slot_threshold=slot_t,
        token_threshold=token_t,
    )
    assert ours == ref


# A hand-made case for the reference's EOS bug in the parallel path.
# Slots of 2 tokens, one block of 4 slots (positions 1..8 after a 1-token prompt).
# Iteration 1 chooses slots 2 and 3 (confident first tokens); global verification
# fails (low AR confidence everywhere); parallel infilling drafts EOS at position 8
# once position 7 is known, so slot 3 (the 2nd chosen slot) ends in EOS. The
# reference then drops the remaining slots from index 1 (the chosen-list index of
# slot 3) on, which includes slot 1, never generated: a silent gap. refusion drops
# only the slots after the EOS slot.
V, MASK, EOS = 10, 9, 2
CONFIDENT = {5: 7, 7: 8}  # first tokens of slots 2 and 3
DRAFT = {1: 3, 2: 4, 3: 5, 4: 6, 6: 6, 8: 0}


def _rule(seen, position, token):
    if token == MASK:
        if position == 8 and seen.get(7) == 8:
            return one_hot_logits(V, EOS, 0.9)
        want = CONFIDENT.get(position, DRAFT.get(position, 1))
        return one_hot_logits(V, want, 0.95 if position in CONFIDENT else 0.5)
    return one_hot_logits(V, DRAFT.get(position + 1, 1), 0.3)  # AR verification always fails


def _scripted():
    return ScriptedModel(_rule, vocab_size=V, mask_token_id=MASK, eos_token_id=EOS)


class _AsTransformersModel:
    """Lets the reference restatement call a ScriptedModel like a transformers model."""

    config = None

    def __init__(self, scripted):
        self.scripted = scripted

    def __call__(self, input_ids, position_ids, attention_mask, cache, use_cache=True):
        from types import SimpleNamespace

        return SimpleNamespace(logits=self.scripted.forward(input_ids, position_ids, attention_mask, cache))


def _decode_both(eos_bug):
    decoder = Decoder.from_names(slot_size=2, serial_num_blocks=1, slot_threshold=0.9, token_threshold=0.9)
    ours = decoder.decode(_scripted(), [0], 8, record=True)
    ref = reference_refusion(
        _AsTransformersModel(_scripted()),
        [0],
        8,
        mask_id=MASK,
        eos_id=EOS,
        slot_size=2,
        serial_num_blocks=1,
        slot_threshold=0.9,
        token_threshold=0.9,
        eos_bug=eos_bug,
    )
    return ours, ref


def test_eos_in_parallel_path_drops_only_later_slots():
    ours, ref = _decode_both(eos_bug=False)
    first = ours.iterations[0]
    assert first.selected == (2, 3)
    assert [s for s, _ in first.committed] == [2, 3]
    assert ours.stopped_at_eos
    assert (ours.commit_step >= 0).all()  # slots 0 and 1 were still decoded after the EOS in slot 3
    assert ours.tokens.tolist() == [3, 4, 5, 6, 7, 6, 8, EOS]
    assert ours.tokens.tolist() == ref


def test_reference_bug_would_leave_slot_1_ungenerated():
    ours, buggy = _decode_both(eos_bug=True)
    assert buggy != ours.tokens.tolist()
    assert len(buggy) == 6  # positions 3 and 4 (slot 1) are missing from the reference's answer
