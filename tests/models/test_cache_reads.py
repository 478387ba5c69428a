"""The cache slots a decode step reads (models.transformer.cache_slots_read), by hand."""

import pytest

from models.transformer import cache_slots_read, decode_extents


def test_cache_slots_read_by_hand():
    # prompts of 100 tokens left padded to 112 slots, 60 new tokens, 176 slots: extents 128
    # and 176. Steps t = 1..59 write slot 111 + t: t <= 16 read 128 slots, the other 43 read
    # 176; the rows hold 100 + t tokens, 130 on average
    held, read = cache_slots_read(100, 112, 60, 176)
    assert held == pytest.approx(130.0)
    assert read == pytest.approx((16 * 128 + 43 * 176) / 59)
    # the Pallas decode kernel reads each row's own slots: what it holds
    assert cache_slots_read(100, 112, 60, 176, "pallas_gpu") == pytest.approx((130.0, 130.0))


def test_on_cpu_a_decode_reads_no_prefix_past_half_the_cache():
    # blocks of 128 slots; past the first write (slot 0 or 200); on CPU at most half the cache
    assert decode_extents(512) == (128, 256, 384, 512)
    assert decode_extents(512, platform="cpu") == (128, 256, 512)
    assert decode_extents(416, 200, platform="tpu") == (256, 384, 416)
    assert decode_extents(416, 200, platform="cpu") == (416,)
    # the 176-slot cache above: half is 88, so on CPU every step reads all 176 slots
    assert cache_slots_read(100, 112, 60, 176, platform="cpu") == pytest.approx((130.0, 176.0))
