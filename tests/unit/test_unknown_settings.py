"""A key a component does not take (Hydra's `+group.key=` lets it through) is refused by the config
check with one line naming it and the component's settings, not by a TypeError in a worker."""

import pytest

from compbench.compose import config
from tests.helpers import TINY


@pytest.mark.parametrize("override, message", [
    ("+compressor.ratoi=0.1", "compressor.ratoi is not a setting of compressor=topk; its settings are: rat"),
    ("+comm.foo=1", "comm.foo is not a setting of comm=allgather; it takes none"),
    ("+memory.betta=0.5", "memory.betta is not a setting of memory=residual; its settings are: beta, gamma"),
])
def test_unknown_setting_is_refused(override, message):
    with pytest.raises(ValueError, match="^" + message.replace(".", r"\.")):
        config.check(config.compose([*TINY, "compressor=topk", "comm=allgather", override]))
