"""Everything a plugin author imports, from one place.

The part interfaces and what they receive and return, the protocol an infiller speaks to the model, the batched
form an infiller may name, the hook marker and in-process registration, the errors to raise::

    from refusion.parts import SlotSelector, Plan, hookimpl, register

Part interfaces: :class:`SlotPartitioner`, :class:`SlotSelector`, :class:`Infiller`, :class:`CacheReorderer`,
:class:`Reviser` (their traits, which let the decode loop decide rows together, are documented on
:class:`Part`). Data: :class:`Slot`, :class:`Partition`, :class:`Plan`, :class:`Plans`, :class:`Commit`,
:class:`InfillResult`, :class:`InfillContext`, :class:`RevisionView`, :class:`Revision`, :class:`CacheEditor`.
Model calls: :class:`ModelCall`, :class:`Extend`, :class:`ExtendOutput`, :class:`Branch`, :data:`ROOT`,
:class:`KVSegment`, :class:`BlockReuse`. Batched forms: :class:`BatchedForm`. Registration: :func:`hookimpl`
(entry-point plugins), :func:`register` (in this process). Errors: :class:`ConfigError` (bad parameters),
:class:`PluginError`.
"""

from refusion.cache.segment import KVSegment
from refusion.decoding.context import CacheEditor
from refusion.decoding.forms.base import BatchedForm
from refusion.decoding.plans import Plans
from refusion.decoding.protocol import ROOT, BlockReuse, Branch, Extend, ExtendOutput, ModelCall
from refusion.decoding.types import Commit, DecodeResult, InfillResult, Partition, Plan, Slot
from refusion.errors import ConfigError, PluginError
from refusion.plugins import hookimpl
from refusion.plugins.registry import register
from refusion.strategies.base import (
    CacheReorderer,
    InfillContext,
    Infiller,
    InfillProgram,
    Part,
    Reviser,
    Revision,
    RevisionView,
    SlotPartitioner,
    SlotSelector,
)

__all__ = [
    "ROOT",
    "BatchedForm",
    "BlockReuse",
    "Branch",
    "CacheEditor",
    "CacheReorderer",
    "Commit",
    "ConfigError",
    "DecodeResult",
    "Extend",
    "ExtendOutput",
    "InfillContext",
    "InfillProgram",
    "InfillResult",
    "Infiller",
    "KVSegment",
    "ModelCall",
    "Part",
    "Partition",
    "Plan",
    "Plans",
    "PluginError",
    "Reviser",
    "Revision",
    "RevisionView",
    "Slot",
    "SlotPartitioner",
    "SlotSelector",
    "hookimpl",
    "register",
]
