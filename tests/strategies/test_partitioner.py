"""The fixed-slot partitioner's rule and its validation."""

import pytest

from refusion.errors import ConfigError
from refusion.strategies.partitioners.fixed import FixedSlots


def test_slots_and_blocks():
    p = FixedSlots(slot_size=4, serial_num_blocks=2).partition(16)
    assert p.gen_length == 16
    assert [(s.offset, s.length, s.block) for s in p.slots] == [(0, 4, 0), (4, 4, 0), (8, 4, 1), (12, 4, 1)]
    assert p.blocks == ((0, 1), (2, 3))


def test_gen_length_is_honoured_with_a_shorter_last_slot():
    p = FixedSlots(slot_size=8, serial_num_blocks=1).partition(13)
    assert p.gen_length == 13 and [(s.offset, s.length) for s in p.slots] == [(0, 8), (8, 5)]


def test_semi_ar_honours_gen_length_with_a_shorter_last_block():
    from refusion.strategies.partitioners.semi_ar import SemiAutoregressive

    p = SemiAutoregressive(block_length=4, slot_size=2).partition(7)
    assert p.gen_length == 7 and p.blocks == ((0, 1), (2, 3))
    assert [(s.offset, s.length, s.block) for s in p.slots] == [(0, 2, 0), (2, 2, 0), (4, 2, 1), (6, 1, 1)]


def test_blocks_must_divide_the_slots():
    with pytest.raises(ConfigError) as err:
        FixedSlots(slot_size=4, serial_num_blocks=3).partition(16)
    message = str(err.value)
    assert "`gen_length` 16 gives 4 slots" in message
    assert "Nearest allowed `gen_length`: 12 or 21" in message and "`serial_num_blocks` in: 1, 2, 4" in message


@pytest.mark.parametrize("field", ["slot_size", "serial_num_blocks"])
@pytest.mark.parametrize("bad", [0, -3, 2.5, True])
def test_parameters_are_positive_integers(field, bad):
    with pytest.raises(ConfigError, match=f"`{field}` must be an integer >= 1"):
        FixedSlots(**{field: bad})


@pytest.mark.parametrize("bad", [0, -1, 3.0])
def test_gen_length_is_checked(bad):
    with pytest.raises(ConfigError, match="`gen_length` must be an integer >= 1"):
        FixedSlots().partition(bad)


def test_fit_length_is_the_nearest_longer_length_the_partitioner_accepts():
    from refusion.decoding.decoder import Decoder

    decoder = Decoder.from_names(slot_size=8, serial_num_blocks=2)
    assert decoder.fit_length(100) == 105  # 13 slots do not split into 2 blocks; 105 gives 14
    assert decoder.fit_length(96) == 96
    assert decoder.fit_length(1) == 9
