"""The fixed-slot partitioner's rule and its validation."""

import pytest

from refusion.errors import ConfigError
from refusion.strategies.partitioners.fixed import FixedSlots


def test_slots_and_blocks():
    p = FixedSlots(slot_size=4, serial_num_blocks=2).partition(16)
    assert p.gen_length == 16
    assert [(s.offset, s.length, s.block) for s in p.slots] == [(0, 4, 0), (4, 4, 0), (8, 4, 1), (12, 4, 1)]
    assert p.blocks == ((0, 1), (2, 3))


def test_gen_length_is_rounded_up_to_whole_slots():
    p = FixedSlots(slot_size=8, serial_num_blocks=1).partition(13)
    assert p.gen_length == 16 and len(p.slots) == 2


def test_blocks_must_divide_the_slots():
    with pytest.raises(ConfigError) as err:
        FixedSlots(slot_size=4, serial_num_blocks=3).partition(16)
    message = str(err.value)
    assert "`serial_num_blocks` must divide the number of slots (4" in message
    assert "Allowed: 1, 2, 4" in message


@pytest.mark.parametrize("field", ["slot_size", "serial_num_blocks"])
@pytest.mark.parametrize("bad", [0, -3, 2.5, True])
def test_parameters_are_positive_integers(field, bad):
    with pytest.raises(ConfigError, match=f"`{field}` must be an integer >= 1"):
        FixedSlots(**{field: bad})


@pytest.mark.parametrize("bad", [0, -1, 3.0])
def test_gen_length_is_checked(bad):
    with pytest.raises(ConfigError, match="`gen_length` must be an integer >= 1"):
        FixedSlots().partition(bad)


def test_fit_length_rounds_to_what_the_partitioner_accepts():
    from refusion.decoder import Decoder

    decoder = Decoder.from_names(slot_size=8, serial_num_blocks=2)
    assert decoder.fit_length(100) == 112
    assert decoder.fit_length(1) == 16
