"""refusion_kernels: fused kernels for refusion (Triton), each with a pure-torch reference.

Installed from the repository's ``kernels/refusion_kernels/`` folder under the
import name ``refusion_kernels``. ``kernels/`` itself is not a package: a PyPI
package called ``kernels`` exists, transformers (>= 5.25) requires and imports
it, and a ``kernels/__init__.py`` at the repository root would shadow it
whenever the root is on ``sys.path`` (``python -m pytest`` there). Every public function picks its backend with
:func:`refusion_kernels.backend.choose`: Triton for CUDA tensors when Triton
is installed, the torch reference otherwise; ``backend=`` or the environment
variable ``REFUSION_KERNELS`` (``auto``, ``torch``, ``triton``) forces one.
"""

from refusion_kernels.backend import choose, triton_available
from refusion_kernels.confidence import confidence, confidence_reference
from refusion_kernels.lm_head import lm_head_stats, lm_head_stats_reference
from refusion_kernels.paged import paged_attention, paged_attention_reference
from refusion_kernels.scatter import scatter_kv, scatter_kv_reference

__all__ = [
    "choose",
    "confidence",
    "confidence_reference",
    "lm_head_stats",
    "lm_head_stats_reference",
    "paged_attention",
    "paged_attention_reference",
    "scatter_kv",
    "scatter_kv_reference",
    "triton_available",
]
