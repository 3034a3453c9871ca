"""Property (a): leftmost selection + lossless infilling is greedy AR decoding, token for token."""

from hypothesis import given
from hypothesis import strategies as st

from refusion.decoding.decoder import Decoder
from tests.support.helpers import hf_greedy, layouts, model_setups


@given(setup=model_setups(), layout=layouts(), reorderer=st.sampled_from(["commit-order", "reencode"]))
def test_leftmost_lossless_equals_transformers_generate(setup, layout, reorderer):
    adapter, prompt = setup
    slot, blocks, gen_length = layout
    decoder = Decoder.from_names(
        selector="leftmost", infiller="greedy-verify", reorderer=reorderer, slot_size=slot, serial_num_blocks=blocks
    )
    result = decoder.decode(adapter, prompt, gen_length)
    expected = hf_greedy(adapter, prompt, result.partition.gen_length)
    assert result.tokens.tolist() == expected


def test_ar_preset_matches_generate_on_a_fixed_case():
    from tests.support.helpers import tiny

    adapter = tiny(vocab=32, seed=7, scale=6.0, eos=None)
    prompt = [3, 1, 4, 1, 5]
    result = Decoder.from_names(selector="leftmost", infiller="greedy-verify", slot_size=4, serial_num_blocks=2).decode(
        adapter, prompt, 16
    )
    assert result.tokens.tolist() == hf_greedy(adapter, prompt, 16)
    assert len(result.tokens) == 16
