"""Engines: what runs the decoder's model calls (see :mod:`refusion.engines.base` for the interface)."""

from refusion.engines.base import Engine, SequenceState
from refusion.engines.choose import choose_engine, engine_class, open_engine
from refusion.engines.driver import Runner, drive

__all__ = ["Engine", "Runner", "SequenceState", "choose_engine", "drive", "engine_class", "open_engine"]
