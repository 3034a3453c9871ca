"""The former name of :mod:`refusion.batcher`: ``Generator`` is :class:`~refusion.batcher.Batcher` (continuous
batching), kept for code written against it. New code: ``refusion.Batcher``."""

from refusion.batcher import HOLD_FOR_PREFIX, Batcher, CommittedSlot, Progress, Request

#: the former name of :class:`~refusion.batcher.Batcher`
Generator = Batcher

__all__ = ["HOLD_FOR_PREFIX", "Batcher", "CommittedSlot", "Generator", "Progress", "Request"]
