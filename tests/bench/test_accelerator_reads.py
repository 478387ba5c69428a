"""bench.accelerator's decode-step bytes with prompts shared by groups on a paged cache, by
hand: the step must read a group's prompt pages once, and the paged kernels read them once a
group."""

import argparse

import pytest

from bench.accelerator import decode_step_bytes, decode_step_lines
from models.presets import tiny_config


@pytest.mark.parametrize("shared, kernel", [(False, "paged_gpu"), (True, "paged_gpu"),
                                            (True, "paged_tpu")])
def test_a_paged_decode_step_counts_shared_prompt_pages_once_in_its_floor(shared, kernel,
                                                                         capsys):
    cfg = tiny_config()  # 2 layers x 2 KV heads x 16 dims: 256 bfloat16 bytes a slot a row
    args = argparse.Namespace(prompt_len=64, new_tokens=32, group=4, batch=8,
                              shared_prompts=shared, decode_kernel=kernel)
    got = decode_step_lines(cfg, args, 1e-3, None)
    weights = decode_step_bytes(cfg, 8, 0)
    # step t = 1..31 holds the 64 prompt slots (4 full pages) and t more, 80 on average;
    # shared by 4 rows, 3/4 of the prompt held and read once a group: 32 a row
    held = read = 32 if shared else 80
    assert got["decode_step_gb"] * 1e9 - weights == pytest.approx(8 * held * 256)
    assert got["decode_step_read_gb"] * 1e9 - weights == pytest.approx(8 * read * 256)
    assert f"mean {held} slots a row" in capsys.readouterr().out
