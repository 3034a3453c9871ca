"""Engines: what runs the decoder's model calls (see :mod:`refusion.engines.base` for the interface)."""

from refusion.engines.base import Engine, SequenceState
from refusion.engines.factory import choose_engine, engine_class, open_engine

__all__ = ["Engine", "SequenceState", "choose_engine", "engine_class", "open_engine"]
