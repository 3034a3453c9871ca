"""The keys and values of a run of tokens, for every layer at once: what infillers hand to a cache reorderer and
what stores keep. Knows nothing about decoding."""

from __future__ import annotations

from collections.abc import Sequence

import attrs
import torch


@attrs.frozen(eq=False)
class KVSegment:
    """Keys and values of ``n`` consecutive tokens.

    ``data`` has shape ``(layers, 2, kv_heads, n, head_dim)``; index 0 of the
    second axis holds keys, index 1 values (after RoPE and q/k-norm, exactly as
    the model's attention cached them).
    """

    data: torch.Tensor

    def __len__(self) -> int:
        return self.data.shape[3]

    def __getitem__(self, index: slice) -> KVSegment:
        if not isinstance(index, slice) or index.step not in (None, 1):
            raise TypeError("KVSegment supports contiguous slices only")
        return KVSegment(self.data[:, :, :, index])

    @staticmethod
    def cat(segments: Sequence[KVSegment | None]) -> KVSegment | None:
        """Concatenate segments along the token axis (``None`` entries are skipped)."""
        parts = [s.data for s in segments if s is not None and len(s)]
        if not parts:
            return None
        return KVSegment(parts[0] if len(parts) == 1 else torch.cat(parts, dim=3))

    @staticmethod
    def from_layers(
        layers: Sequence[tuple[torch.Tensor, torch.Tensor]], batch: int, start: int, stop: int
    ) -> KVSegment:
        """Cut tokens ``start:stop`` of batch row ``batch`` out of per-layer ``(keys, values)``.

        Each ``keys``/``values`` tensor has shape ``(batch, kv_heads, length, head_dim)``.
        """
        return KVSegment(
            torch.stack([torch.stack((k[batch, :, start:stop], v[batch, :, start:stop])) for k, v in layers])
        )
