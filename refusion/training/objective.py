"""ReFusion's training objective (arXiv 2512.13586, Sec. 3.1), for any Hugging Face causal LM.

Each response is cut into slots (slot size drawn per example); every slot is
masked with probability ``p`` (``p`` drawn uniformly in ``[eps, 1]``). The
clean slots come first, shuffled, with their true position ids; the masked
slots follow, in order, as mask tokens. Loss = AR cross-entropy on the clean
slots (each token predicts the next one inside its slot; a slot's last token
has no target) + MDM cross-entropy on the masked tokens (target: the token
itself) weighted by ``1/p`` and normalised by the answer length.

``ar_fraction`` of the examples are instead plain next-token examples (natural
order, the prompt's last token predicting the first answer token). This is
not in the paper; it keeps the same weights usable as an AR model, which the
shipped model needs for its AR baseline.
"""

from __future__ import annotations

import random
from collections.abc import Sequence

import attrs
import torch
import torch.nn.functional as F

IGNORE = -100


@attrs.frozen
class TrainingExample:
    """One example laid out for the model; all lists have the same length.

    ``input_ids`` (reorganized order), ``position_ids`` (true positions),
    ``labels`` (target per row, ``-100`` for none), ``masked`` (row is an MDM
    row), ``p_mask`` (masking rate of the example) and ``answer_length``.
    """

    input_ids: list[int]
    position_ids: list[int]
    labels: list[int]
    masked: list[bool]
    p_mask: float
    answer_length: int


def refusion_example(
    prompt: Sequence[int],
    answer: Sequence[int],
    rng: random.Random,
    *,
    mask_token_id: int,
    slot_sizes: Sequence[int] = (4, 8, 16, 32),
    eps: float = 1e-3,
) -> TrainingExample:
    """Lay out one (prompt, answer) pair with the ReFusion objective's random slots and masks."""
    prompt, answer = list(prompt), list(answer)
    if not answer:
        raise ValueError("`answer` must not be empty")
    size = rng.choice(list(slot_sizes))
    starts = range(0, len(answer), size)
    slots = [answer[s : s + size] for s in starts]
    positions = [list(range(len(prompt) + s, len(prompt) + s + len(slot))) for s, slot in zip(starts, slots)]
    p = (1 - eps) * rng.random() + eps
    is_masked = [rng.random() < p for _ in slots]
    clean = [i for i, m in enumerate(is_masked) if not m]
    rng.shuffle(clean)
    masked = [i for i, m in enumerate(is_masked) if m]

    ids, pos, labels, flags = list(prompt), list(range(len(prompt))), [IGNORE] * len(prompt), [False] * len(prompt)
    for i in clean:
        ids += slots[i]
        pos += positions[i]
        labels += slots[i][1:] + [IGNORE]
        flags += [False] * len(slots[i])
    for i in masked:
        ids += [mask_token_id] * len(slots[i])
        pos += positions[i]
        labels += slots[i]
        flags += [True] * len(slots[i])
    return TrainingExample(ids, pos, labels, flags, p, len(answer))


def ar_example(prompt: Sequence[int], answer: Sequence[int]) -> TrainingExample:
    """A plain next-token example: prompt then answer, every answer token a target."""
    prompt, answer = list(prompt), list(answer)
    ids = prompt + answer
    labels = [IGNORE] * (len(prompt) - 1) + answer + [IGNORE]
    return TrainingExample(ids, list(range(len(ids))), labels, [False] * len(ids), 1.0, len(answer))


def collate(examples: Sequence[TrainingExample], pad_token_id: int) -> dict[str, torch.Tensor]:
    """Right-pad a batch: ``input_ids``, ``position_ids``, ``attention_mask``, ``labels``, ``masked`` of
    shape ``(batch, length)``; ``p_mask`` and ``answer_length`` of shape ``(batch,)``."""
    width = max(len(e.input_ids) for e in examples)
    b = len(examples)
    out = {
        "input_ids": torch.full((b, width), pad_token_id, dtype=torch.long),
        "position_ids": torch.zeros((b, width), dtype=torch.long),
        "attention_mask": torch.zeros((b, width), dtype=torch.long),
        "labels": torch.full((b, width), IGNORE, dtype=torch.long),
        "masked": torch.zeros((b, width), dtype=torch.bool),
        "p_mask": torch.tensor([e.p_mask for e in examples], dtype=torch.float32),
        "answer_length": torch.tensor([e.answer_length for e in examples], dtype=torch.float32),
    }
    for row, e in enumerate(examples):
        n = len(e.input_ids)
        out["input_ids"][row, :n] = torch.tensor(e.input_ids)
        out["position_ids"][row, :n] = torch.tensor(e.position_ids)
        out["position_ids"][row, n:] = torch.arange(n, width)
        out["attention_mask"][row, :n] = 1
        out["labels"][row, :n] = torch.tensor(e.labels)
        out["masked"][row, :n] = torch.tensor(e.masked)
    return out


def refusion_loss(logits: torch.Tensor, batch: dict[str, torch.Tensor]) -> tuple[torch.Tensor, dict[str, float]]:
    """ReFusion loss from ``logits`` of shape ``(batch, length, vocab)`` and a :func:`collate` batch.

    Returns the scalar loss and its two parts (floats) for logging.
    """
    labels, masked = batch["labels"], batch["masked"]
    logits = logits.float()
    ar_rows = (labels != IGNORE) & ~masked
    zero = logits.sum() * 0.0
    ar = F.cross_entropy(logits[ar_rows], labels[ar_rows]) if bool(ar_rows.any()) else zero
    if bool(masked.any()):
        weight = (batch["p_mask"][:, None] * batch["answer_length"][:, None]).expand_as(labels)
        per_token = F.cross_entropy(logits[masked], labels[masked], reduction="none") / weight[masked]
        mdm = per_token.sum() / labels.shape[0]
    else:
        mdm = zero
    return ar + mdm, {"ar": float(ar.detach()), "mdm": float(mdm.detach())}
