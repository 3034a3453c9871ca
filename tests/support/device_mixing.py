"""Find, on the CPU, the torch calls of a decode that CUDA would refuse because they mix devices.

:class:`DeviceMixing` extends :class:`~refusion.measure.host_reads.HostReads`,
which already follows where each tensor of a decode would live on a GPU
(network data, tensors placed on the model's device, host tensors), and
records every call that combines a device-resident tensor with a host
tensor of one or more dimensions where CUDA raises "Expected all tensors to
be on the same device": elementwise ops, ``cat``/``stack``, ``where``,
``index_select``/``gather``/``isin``, indexing a host tensor with device
indices, advanced-index assignment of host values into a device tensor, and
so on. Allowed, as on CUDA: 0-dim host tensors (scalars), copies between
devices (``to``, ``copy_``, slice assignment), a device tensor indexed by
host indices, shape-only calls (``expand_as``, ``new_*``).
"""

from __future__ import annotations

import collections
import sys
from typing import Any

import torch

from refusion.measure.host_reads import HostReads, call_site

#: calls that move or copy data between devices, or read only shapes: never a device mix
_CROSSING = frozenset(
    {
        "to",
        "copy_",
        "cpu",
        "cuda",
        "numpy",
        "tolist",
        "item",
        "type_as",
        "expand_as",
        "view_as",
        "reshape_as",
        "new_tensor",
        "new_zeros",
        "new_ones",
        "new_full",
        "new_empty",
        "__format__",
        "__repr__",
        "__str__",
        "size",
        "dim",
        "numel",
        "__len__",
        "__get__",
        "__bool__",
        "__int__",
        "__float__",
        "__index__",
        "__contains__",
    }
)


#: factory functions: without ``device=`` they make host tensors, also inside a network call
_FACTORIES = frozenset(
    {
        "zeros",
        "ones",
        "full",
        "empty",
        "arange",
        "tensor",
        "as_tensor",
        "randn",
        "rand",
        "randint",
        "eye",
        "linspace",
        "randperm",
    }
)


def _tensors(value: Any) -> list[torch.Tensor]:
    if isinstance(value, torch.Tensor):
        return [value]
    if isinstance(value, (list, tuple)):
        return [v for v in value if isinstance(v, torch.Tensor)]
    return []


def _basic(index: Any) -> bool:
    """An index without tensors or lists (slices, ints, None, Ellipsis): assignment through it is a copy."""
    items = index if isinstance(index, tuple) else (index,)
    return not any(isinstance(i, (torch.Tensor, list)) for i in items)


class DeviceMixing(HostReads):
    """``with DeviceMixing(model) as found:`` ``found.mixes`` counts ``(call, site)`` of device-mixing calls."""

    def __init__(self, model: Any = None):
        super().__init__(model, placed=True)
        self.mixes: collections.Counter[tuple[str, str]] = collections.Counter()

    def _on_device(self, t: torch.Tensor) -> bool:
        return self._level(t) > 0

    def _host_array(self, t: torch.Tensor) -> bool:
        return not self._on_device(t) and t.dim() > 0

    def _mixed(self, name: str, args: tuple, kwargs: dict) -> bool:
        if name in _CROSSING:
            return False
        if name in ("__getitem__", "__setitem__") and args:
            target, index = args[0], args[1] if len(args) > 1 else None
            indices = [t for t in _tensors(index if isinstance(index, (tuple, list)) else (index,))]
            if self._on_device(target):
                if name == "__setitem__" and len(args) > 2 and isinstance(args[2], torch.Tensor):
                    return self._host_array(args[2]) and not _basic(index)  # host values through an advanced index
                return False  # host indices into a device tensor: CUDA copies them
            return any(self._on_device(t) for t in indices) or (
                name == "__setitem__"
                and len(args) > 2
                and isinstance(args[2], torch.Tensor)
                and self._on_device(args[2])
                and not _basic(index)
            )
        tensors = [t for value in (*args, *kwargs.values()) for t in _tensors(value)]
        return any(self._on_device(t) for t in tensors) and any(self._host_array(t) for t in tensors)

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        name = getattr(func, "__name__", "")
        if self._inside and name in _FACTORIES and kwargs.get("device") is None:
            return func(*args, **kwargs)  # HostReads counts it as network data; on a GPU it is made on the host
        if name != "__get__" and self._mixed(name, args, kwargs):
            self.mixes[(name, call_site(sys._getframe(1)))] += 1
        return super().__torch_function__(func, types, args, kwargs)
