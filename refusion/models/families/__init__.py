"""Published diffusion-LM checkpoint families, loaded into transformers' maintained classes (no remote code).

See :mod:`refusion.models.families.base` for the :class:`ModelFamily`
contract; one module per family: ``llada``, ``dream``, ``sdar``, ``refusion``.
"""

from refusion.models.families.base import ModelFamily

__all__ = ["ModelFamily"]
