"""The ReFusion training objective, the synthetic tasks, the tokenizer and the trainer."""

import random

import pytest
import torch
import torch.nn.functional as F

from refusion.training.objective import IGNORE, ar_example, collate, refusion_example, refusion_loss
from refusion.training.tasks import TASKS, examples, held_out, is_correct
from refusion.training.tokenizer import char_tokenizer


class ScriptedRandom:
    """Stands in for random.Random with chosen draws."""

    def __init__(self, draws, size):
        self.draws, self.size = list(draws), size

    def choice(self, seq):
        assert self.size in seq
        return self.size

    def random(self):
        return self.draws.pop(0)

    def shuffle(self, items):
        items.reverse()


M = 99


def hand_made():
    # answer [1,2,3,4,5] in slots [1,2] [3,4] [5]; t=0.5; slot 1 masked (draw 0.1 < p), slots 0 and 2 clean.
    rng = ScriptedRandom([0.5, 0.9, 0.1, 0.7], size=2)
    return refusion_example([10, 11], [1, 2, 3, 4, 5], rng, mask_token_id=M, slot_sizes=(2, 4), eps=1e-3)


def test_layout_of_a_hand_made_example():
    ex = hand_made()
    # clean slots first, shuffled (here reversed: slot 2 then slot 0), masked slots after, in order
    assert ex.input_ids == [10, 11, 5, 1, 2, M, M]
    assert ex.position_ids == [0, 1, 6, 2, 3, 4, 5]
    # AR targets: next token inside a clean slot; a slot's last token has none; MDM targets: the token itself
    assert ex.labels == [IGNORE, IGNORE, IGNORE, 2, IGNORE, 3, 4]
    assert ex.masked == [False, False, False, False, False, True, True]
    assert ex.p_mask == pytest.approx((1 - 1e-3) * 0.5 + 1e-3)
    assert ex.answer_length == 5


def test_loss_of_a_hand_made_example():
    ex = hand_made()
    batch = collate([ex], pad_token_id=0)
    torch.manual_seed(0)
    logits = torch.randn(1, 7, 100)
    loss, parts = refusion_loss(logits, batch)
    ar = F.cross_entropy(logits[0, 3:4], torch.tensor([2]))
    mdm = (F.cross_entropy(logits[0, 5:7], torch.tensor([3, 4]), reduction="sum")) / ex.p_mask / 5
    assert parts["ar"] == pytest.approx(float(ar))
    assert parts["mdm"] == pytest.approx(float(mdm))
    assert float(loss) == pytest.approx(float(ar + mdm))


def test_all_masked_and_all_clean_extremes():
    all_masked = refusion_example([7], [1, 2, 3], ScriptedRandom([0.99, 0.0, 0.0], 2), mask_token_id=M, slot_sizes=(2,))
    assert all_masked.input_ids == [7, M, M, M] and all_masked.labels == [IGNORE, 1, 2, 3]
    all_clean = refusion_example([7], [1, 2, 3], ScriptedRandom([0.0, 0.9, 0.9], 2), mask_token_id=M, slot_sizes=(2,))
    assert sorted(all_clean.position_ids) == [0, 1, 2, 3] and M not in all_clean.input_ids


def test_ar_example_targets_every_answer_token():
    ex = ar_example([7, 8], [1, 2, 3])
    assert ex.input_ids == [7, 8, 1, 2, 3]
    assert ex.labels == [IGNORE, 1, 2, 3, IGNORE]


def test_collate_pads_and_masks():
    batch = collate([ar_example([7], [1]), ar_example([7, 8], [1, 2])], pad_token_id=0)
    assert batch["input_ids"].tolist() == [[7, 1, 0, 0], [7, 8, 1, 2]]
    assert batch["attention_mask"].tolist() == [[1, 1, 0, 0], [1, 1, 1, 1]]
    assert batch["labels"][0].tolist() == [1, IGNORE, IGNORE, IGNORE]


def test_random_examples_keep_every_answer_token_once():
    rng = random.Random(3)
    for _ in range(200):
        answer = [rng.randrange(1, 50) for _ in range(rng.randint(1, 30))]
        ex = refusion_example([60, 61], answer, rng, mask_token_id=M, slot_sizes=(2, 4, 8))
        seen = {}
        for tok, pos, lab, m in zip(ex.input_ids[2:], ex.position_ids[2:], ex.labels[2:], ex.masked[2:]):
            seen[pos] = lab if m else tok
        assert [seen[p] for p in range(2, 2 + len(answer))] == answer


@pytest.mark.parametrize("task", sorted(TASKS))
def test_task_answers_are_correct(task):
    rng = random.Random(0)
    for _ in range(100):
        ex = TASKS[task](rng)
        body = ex.prompt[:-1].split(" ", 1)[1]
        if task == "add":
            a, b = body.split("+")
            assert ex.answer == str(int(a) + int(b))[::-1]
        elif task == "sort":
            assert ex.answer == "".join(sorted(body))
        elif task == "reverse":
            assert ex.answer == body[::-1]
        elif task == "copy":
            assert ex.answer == body
        elif task == "count":
            c, word = body.split(":")
            assert ex.answer == str(word.count(c))
        elif task == "repeat":
            k, word = body.split(" ")
            assert ex.answer == word * int(k)
        assert is_correct(ex, f" {ex.answer} ") and not is_correct(ex, ex.answer + "x")


def test_streams_are_reproducible_and_held_out_is_disjoint_from_its_seed():
    a = [next(iter(examples(5))) for _ in range(3)]
    assert a == [next(iter(examples(5))) for _ in range(3)]
    assert held_out(4) == held_out(4)
    assert {e.task for e in held_out(2)} == set(TASKS)


def test_tokenizer_round_trip():
    tok = char_tokenizer()
    ids = tok("rev abc=", add_special_tokens=False)["input_ids"]
    assert len(ids) == len("rev abc=")
    assert tok.decode(ids + [tok.eos_token_id], skip_special_tokens=True) == "rev abc="
    assert tok.mask_token_id is not None and tok.mask_token_id != tok.eos_token_id


def test_trainer_is_reproducible_from_its_seed(tmp_path):
    from safetensors.torch import load_file

    from refusion.training.trainer import TrainConfig, train

    config = TrainConfig(steps=3, batch_size=4, hidden_size=32, num_layers=1, intermediate_size=64, held_out_per_task=2)
    train(config, tmp_path / "a", progress=False)
    train(config, tmp_path / "b", progress=False)
    a, b = load_file(tmp_path / "a" / "model.safetensors"), load_file(tmp_path / "b" / "model.safetensors")
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)
