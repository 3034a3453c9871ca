"""refusion.testing.check_part passes for every built-in part and catches a broken one."""

import attrs
import pytest

from refusion.plugins.registry import registry
from refusion.strategies.base import SlotSelector
from refusion.testing import check_part


@pytest.mark.parametrize("kind", ["partitioner", "selector", "infiller", "reorderer"])
def test_builtins_pass_the_conformance_check(kind):
    for name in registry().names(kind):
        part = registry().build(kind, name)
        if getattr(part, "requires", {}).get("denoiser"):  # canvas-denoising models only: tests/peers decode them
            continue
        check_part(part, trials=3)


@attrs.frozen
class Empty(SlotSelector):
    name = "empty"

    def select(self, plan):
        return []


def test_conformance_check_rejects_a_broken_part():
    from refusion.errors import PluginError

    with pytest.raises(PluginError, match="empty selection"):
        check_part(Empty(), trials=1)
