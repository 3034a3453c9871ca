"""Blocks in flight over one serial block: the state that multi-block selectors (``d3llm``, ``d2f``) keep."""

from __future__ import annotations

import attrs
import torch

from refusion.decoding.types import Plan


@attrs.frozen(eq=False)
class BlocksInFlight:
    """A plan's open slots seen as blocks of ``size`` tokens cut from its serial block's first position.

    ``state`` is the row's memory for the serial block (``plan.memory[name]``: its ``start``, ``length`` and the
    blocks ``added`` so far, which the selector advances); ``block_of`` numbers each open slot's block from 1 (the
    prompt being block 0); ``masks[k]`` and ``sizes[k]`` are block ``k``'s masked and whole token counts.
    """

    state: dict
    block_of: torch.Tensor
    masks: list[int]
    sizes: list[int]

    @classmethod
    def of(cls, plan: Plan, name: str, size: int, added: int) -> BlocksInFlight:
        """The blocks of ``plan``; a serial block's first plan (which holds all of it: all masks) starts the state
        anew with ``added`` blocks."""
        positions = plan.positions[plan.first_rows]
        widths = torch.tensor([slot.length for slot in plan.slots])  # tokens per slot (1 as the authors decode)
        serial = plan.slots[0].block
        state = plan.memory.get(name)
        if state is None or state["serial"] != serial:
            state = {"serial": serial, "start": int(positions.min()), "length": int(widths.sum()), "added": added}
            plan.memory[name] = state
        start, length = state["start"], state["length"]
        blocks = -(-length // size)
        block_of = (positions - start) // size + 1
        masks = torch.bincount(block_of, weights=widths.double(), minlength=blocks + 1).long().tolist()
        sizes = [0] + [min(size, length - (k - 1) * size) for k in range(1, blocks + 1)]
        return cls(state, block_of, masks, sizes)

    @property
    def count(self) -> int:
        """The serial block's number of blocks (the prompt not counted)."""
        return len(self.sizes) - 1

    def progress(self, k: int) -> float:
        """The share of block ``k`` decoded (1 for the prompt, block 0)."""
        return 1.0 if k == 0 else 1.0 - self.masks[k] / self.sizes[k]
