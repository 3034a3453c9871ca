"""Bad input gets a clear error, a misbehaving plugin an error naming it, and decoding never hangs."""

import attrs
import pytest
import torch

from refusion.decoding.decoder import Decoder
from refusion.decoding.protocol import ModelCall
from refusion.decoding.types import Commit, InfillResult
from refusion.errors import ConfigError, PluginError, UnknownNameError
from refusion.models.hf import HFCausalLM
from refusion.models.tiny import tiny_qwen3
from refusion.strategies.base import CacheReorderer, Infiller, SlotSelector
from refusion.strategies.infillers.parallel_ar import ParallelAR
from tests.support.helpers import tiny


@pytest.fixture
def model():
    return tiny(vocab=16, seed=1, scale=8.0)


def paper(**kw):
    return Decoder.from_names(**{"slot_size": 2, "serial_num_blocks": 1, **kw})


@pytest.mark.parametrize(
    "params, message",
    [
        ({"slot_size": 0}, "`slot_size` must be an integer >= 1; got 0"),
        ({"serial_num_blocks": -1}, "`serial_num_blocks` must be an integer >= 1"),
        ({"slot_threshold": 1.2}, "`slot_threshold` must be a number in \\[0, 1\\]; got 1.2"),
        ({"token_threshold": -0.5}, "`token_threshold` must be a number in \\[0, 1\\]; got -0.5"),
    ],
)
def test_bad_parameters(params, message):
    with pytest.raises(ConfigError, match=message):
        Decoder.from_names(**params)


@pytest.mark.parametrize("gen_length", [0, -4])
def test_bad_gen_length(model, gen_length):
    with pytest.raises(ConfigError, match="`gen_length` must be an integer >= 1"):
        paper().decode(model, [1, 2], gen_length)


def test_prompt_plus_generation_longer_than_the_model_allows():
    adapter = HFCausalLM(tiny_qwen3(vocab_size=16, max_positions=32))
    with pytest.raises(ConfigError, match="exceeds the model.s maximum of 32 positions; use gen_length <= 27"):
        paper().decode(adapter, [1, 2, 3, 4, 5], 28)


@pytest.mark.parametrize(
    "prompt, message",
    [
        ([], "at least one token"),
        ([[1, 2], [3, 4]], "one prompt"),
        ([1, 99], "token ids in \\[0, 16\\)"),
        ("text", "sequence of token ids"),
    ],
)
def test_bad_prompts(model, prompt, message):
    with pytest.raises(ConfigError, match=message):
        paper().decode(model, prompt, 4)


def test_a_model_without_a_mask_token_is_refused():
    m = tiny_qwen3(vocab_size=16)
    m.config.mask_token_id = None
    with pytest.raises(ConfigError, match="no mask token.*`mask_token_id=`"):
        HFCausalLM(m)
    assert HFCausalLM(m, mask_token_id=15).mask_token_id == 15


def test_unknown_strategy_name():
    with pytest.raises(
        UnknownNameError, match="Unknown infiller 'fast'. Known infillers: denoise, draft, greedy-verify, parallel-ar"
    ):
        Decoder.from_names(infiller="fast")


@attrs.frozen
class Returns(SlotSelector):
    name = "returns"
    value: object = None

    def select(self, plan):
        return self.value


class LazilyFailing:
    """A sequence that breaks while it is read (as a buggy lazy selection would)."""

    def __iter__(self):
        yield 0
        raise KeyError("lazy")


@pytest.mark.parametrize(
    "value, message",
    [
        ([], "empty selection"),
        ([7], r"indices \[7\] outside range\(0, 2\)"),
        ([0, 0], "duplicate"),
        (["a"], "non-integer"),
        (None, "expected a sequence"),
        ([0.0], "non-integer"),
        ([True], "non-integer"),
        (LazilyFailing(), "malformed answer: reading it raised KeyError"),
    ],
)
def test_malformed_selection_names_the_selector(model, value, message):
    with pytest.raises(PluginError, match=f"selector 'returns' .*Returns.*{message}"):
        paper(selector=Returns(value)).decode(model, [1, 2], 4)


class Raises(SlotSelector):
    name = "raises"

    def select(self, plan):
        raise ZeroDivisionError("oops")


def test_numpy_and_tensor_indices_are_slot_indices(model):
    import numpy as np

    for value in (np.array([0]), [np.int64(0)], torch.tensor([0])):
        assert len(paper(selector=Returns(value)).decode(model, [1, 2], 4).tokens) == 4


class FloatFeeder(Infiller):
    name = "float-feeder"

    def infill(self, ctx, plan, chosen):
        yield ModelCall.of(ctx.extend(plan.tokens[:1].float() + 0.5, plan.positions[:1]))


def test_an_infiller_feeding_float_token_ids_is_named(model):
    with pytest.raises(PluginError, match="infiller 'float-feeder'.*`tokens` must be integer ids; got dtype"):
        paper(infiller=FloatFeeder()).decode(model, [1, 2], 4)


def test_a_raising_plugin_is_named_and_the_decoder_stays_usable(model):
    with pytest.raises(PluginError, match="selector 'raises'.*raised ZeroDivisionError: oops") as err:
        paper(selector=Raises()).decode(model, [1, 2], 4)
    assert err.value.plugin == "raises"
    decoder = paper()
    assert len(decoder.decode(model, [1, 2], 4).tokens) == 4
    assert len(decoder.decode(model, [1, 2], 4).tokens) == 4


class Forever(Infiller):
    name = "forever"

    def infill(self, ctx, plan, chosen):
        while True:
            yield ModelCall.of(ctx.extend(plan.tokens[:1], plan.positions[:1]))


def test_an_infiller_that_never_finishes_is_stopped(model):
    with pytest.raises(PluginError, match="infiller 'forever'.*more than \\d+ model calls"):
        paper(infiller=Forever()).decode(model, [1, 2], 4)


@attrs.frozen
class BadCommits(Infiller):
    name = "bad-commits"
    mode: str = "none"

    def infill(self, ctx, plan, chosen):
        yield from ()
        slot = plan.slots[chosen[0]]
        rows = plan.rows(chosen[0])
        tokens, positions = plan.tokens[rows], plan.positions[rows]
        if self.mode == "none":
            return InfillResult([])
        if self.mode == "unchosen":
            other = next(s for s in plan.slots if s.index not in [plan.slots[i].index for i in chosen])
            return InfillResult([Commit(other, tokens, positions)])
        if self.mode == "short":
            return InfillResult([Commit(slot, tokens[:1], positions[:1])])
        if self.mode == "mask":
            return InfillResult([Commit(slot, torch.full_like(tokens, ctx.mask_token_id), positions)])
        if self.mode == "positions":
            return InfillResult([Commit(slot, tokens, positions + 1)])
        if self.mode == "float":
            return InfillResult([Commit(slot, tokens.float(), positions)])
        if self.mode == "list":
            return InfillResult([Commit(slot, tokens.tolist(), positions)])
        if self.mode == "2d":
            return InfillResult([Commit(slot, tokens[None], positions[None])])
        if self.mode == "lazy":
            return InfillResult(LazilyFailing())
        return "not a result"


@pytest.mark.parametrize(
    "mode, message",
    [
        ("none", "committed no slot"),
        ("unchosen", "which was not chosen"),
        ("short", "partial slot .* not ending in EOS"),
        ("mask", "invalid token ids"),
        ("positions", "wrong position ids"),
        ("junk", "expected an InfillResult"),
        ("float", "dtype torch.float32 .* expected a 1-D integer tensor"),
        ("list", "as list; expected a 1-D integer"),
        ("2d", "shape \\(1, 2\\)"),
        ("lazy", "KeyError: 'lazy'"),
    ],
)
def test_malformed_commits_name_the_infiller(model, mode, message):
    decoder = paper(selector="topk", infiller=BadCommits(mode))  # plans every slot: another one exists
    with pytest.raises(PluginError, match=f"infiller 'bad-commits'.*{message}"):
        decoder.decode(model, [1, 2], 4)


class Forgets(CacheReorderer):
    name = "forgets"

    def reorder(self, cache, result):
        pass


def test_a_reorderer_that_drops_tokens_is_named(model):
    with pytest.raises(PluginError, match="reorderer 'forgets'.*left the cache with 2 entries; expected 4"):
        paper(reorderer=Forgets()).decode(model, [1, 2], 4)


def test_an_infiller_asking_for_bad_token_ids_is_named(model):
    class BadIds(ParallelAR):
        name = "bad-ids"

        def infill(self, ctx, plan, chosen):
            yield ModelCall.of(ctx.extend([999], [3]))

    with pytest.raises(PluginError, match="infiller 'bad-ids'.*token ids outside"):
        paper(infiller=BadIds()).decode(model, [1, 2], 4)


def test_parts_must_be_instances():
    from refusion.strategies.partitioners.fixed import FixedSlots
    from refusion.strategies.reorderers.commit_order import CommitOrder
    from refusion.strategies.selectors.leftmost import Leftmost

    with pytest.raises(ConfigError, match="`infiller` must be a Infiller instance"):
        Decoder(FixedSlots(), Leftmost(), "parallel-ar", CommitOrder())


@attrs.frozen
class Overlapping(
    FixedSlots := __import__("refusion.strategies.partitioners.fixed", fromlist=["FixedSlots"]).FixedSlots
):
    name = "overlapping"
    mode: str = "overlap"

    def partition(self, gen_length):
        from refusion.decoding.types import Partition, Slot

        if self.mode == "overlap":
            return Partition(4, (Slot(0, 0, 3, 0), Slot(1, 2, 2, 0)), ((0, 1),))
        if self.mode == "orphan":
            return Partition(4, (Slot(0, 0, 2, 0), Slot(1, 2, 2, 0)), ((0,),))
        return Partition(2, (Slot(0, 0, 2, 0),), ((0,),))


@pytest.mark.parametrize(
    "mode, message",
    [
        ("overlap", "tile the region"),
        ("orphan", "every slot exactly once"),
        ("short", "region of 2 tokens for the requested 4"),
    ],
)
def test_malformed_partitions_name_the_partitioner(model, mode, message):
    with pytest.raises(PluginError, match=f"partitioner 'overlapping'.*{message}"):
        Decoder.from_names(partitioner=Overlapping(mode=mode)).decode(model, [1, 2], 4)


def test_float_prompt_ids_are_refused(model):
    with pytest.raises(ConfigError, match="`prompt_ids` must be integer token ids; got dtype torch.float32"):
        paper().decode(model, [1.7, 2.2], 4)


def test_calls_per_token_is_validated():
    limit = r"\[1, 64\] \(refusion.limits.MAX_CALLS_PER_TOKEN\)"
    with pytest.raises(ConfigError, match=rf"`calls_per_token` must be an integer in {limit}; got -5"):
        attrs.evolve(paper(), calls_per_token=-5)


def test_an_import_path_to_a_non_class_is_refused():
    with pytest.raises(ConfigError, match="names a function, not a class"):
        Decoder.from_names(selector="refusion.decoding.sampling:greedy")
    with pytest.raises(ConfigError, match="is not a SlotSelector"):  # a class, of the wrong kind
        Decoder.from_names(selector="refusion.strategies.infillers.draft:AcceptDraft")


def test_a_wrong_kind_of_instance_is_refused():
    from refusion.strategies.selectors.leftmost import Leftmost

    with pytest.raises(ConfigError, match="an Infiller subclass or an instance of one; got Leftmost"):
        Decoder.from_names(infiller=Leftmost())


def test_gen_length_zero_is_not_replaced_by_the_preset(model):
    import refusion

    with pytest.raises(ConfigError, match="`gen_length` must be an integer >= 1; got 0"):
        refusion.generate([1, 2], model, gen_length=0)


def test_a_missing_checkpoint_path_is_reported():
    import refusion

    with pytest.raises(ConfigError, match="`model` '/no/such/dir': no such directory"):
        refusion.load_model("/no/such/dir")
