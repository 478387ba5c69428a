"""The cache slots a decode step reads (models.transformer.cache_slots_read), by hand."""

import pytest

from models.transformer import cache_slots_read


def test_cache_slots_read_by_hand():
    # prompts of 100 tokens left padded to 112 slots, 60 new tokens, 176 slots: extents 128
    # and 176. Steps t = 1..59 write slot 111 + t: t <= 16 read 128 slots, the other 43 read
    # 176; the rows hold 100 + t tokens, 130 on average
    held, read = cache_slots_read(100, 112, 60, 176)
    assert held == pytest.approx(130.0)
    assert read == pytest.approx((16 * 128 + 43 * 176) / 59)
    # the Pallas decode kernel reads each row's own slots: what it holds
    assert cache_slots_read(100, 112, 60, 176, "pallas_gpu") == pytest.approx((130.0, 130.0))
