"""bench.shared_prompts, the command of the models guide and the benchmarks page, on the
tiny random model: both caches timed, the greedy tokens equal, and the cache a step reads
as derived by hand."""

import pytest

from bench.shared_prompts import main
from models import load_params


def test_the_benchmark_times_both_caches_and_counts_their_reads(capsys):
    main(["--model", "tiny", "--batch", "4", "--group", "2", "--prompt-len", "16",
          "--new", "4", "--repeats", "1"])
    out = capsys.readouterr().out
    assert "greedy tokens equal" in out
    rows = {cells[0].strip(): [float(c) for c in cells[1:]]
            for cells in (line.split("|") for line in out.splitlines())
            if cells[0].strip() in ("copies", "shared")}
    cfg = load_params("tiny")[0]
    slot = 2 * cfg.num_kv_heads * cfg.head_dim * 4 / 1024  # KiB of keys and values, float32
    # copies: 4 rows x (16 prompt slots + 2.5 generated on average over 4 new tokens);
    # shared: 2 prompts x 16 slots + 4 rows x 2.5
    assert rows["copies"][1] == pytest.approx(4 * 18.5 * slot, abs=0.5)
    assert rows["shared"][1] == pytest.approx((2 * 16 + 4 * 2.5) * slot, abs=0.5)
    assert rows["copies"][0] > 0 and rows["shared"][0] > 0
