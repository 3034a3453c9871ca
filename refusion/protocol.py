"""What strategies exchange with engines (stable import path for plugin authors).

The definitions live in :mod:`refusion.decoding.protocol`.
"""

from refusion.decoding.protocol import BlockReuse, Branch, Epoch, Extend, ExtendOutput, KVSegment, ModelCall, Projection

__all__ = ["BlockReuse", "Branch", "Epoch", "Extend", "ExtendOutput", "KVSegment", "ModelCall", "Projection"]
