"""zcorch.nogc.no_cyclic_gc: off inside, the caller's state after (on or off), also when the block raises."""
from __future__ import annotations

import gc

import pytest

from zcorch.nogc import no_cyclic_gc


@pytest.mark.parametrize("before", [True, False])
def test_the_collector_is_off_inside_and_as_it_was_after(before):
    (gc.enable if before else gc.disable)()
    try:
        with no_cyclic_gc():
            assert not gc.isenabled()
        assert gc.isenabled() is before
        with pytest.raises(RuntimeError):
            with no_cyclic_gc():
                raise RuntimeError("the block failed")
        assert gc.isenabled() is before
    finally:
        gc.enable()
