"""bench.paged_cache, the command of the models guide and the benchmarks page, on the tiny
random model: both caches timed, the greedy tokens equal, and the slots a step reads as
derived by hand."""

from bench.paged_cache import main


def test_the_benchmark_times_both_caches_and_counts_their_reads(capsys):
    main(["--model", "tiny", "--batch", "4", "--prompt-len", "16", "--new", "4",
          "--repeats", "1", "--kernel", "paged_gpu"])
    out = capsys.readouterr().out
    assert "prompts of 4-16 tokens" in out and "greedy tokens equal" in out
    rows = {cells[0].strip(): cells[1:] for cells in (line.split("|") for line in
                                                      out.splitlines())
            if cells[0].strip() in ("xla", "paged_gpu")}
    # dense: 16 prompt slots and 16 for the 4 new tokens (rounded up), one extent read whole
    assert rows["xla"][1].split()[0] == "32"
    # paged: a row reads what it holds, prompts of 4, 8, 12 and 16 tokens (10 on average)
    # and 2.5 new ones on average over the 4 steps
    assert rows["paged_gpu"][1].split()[0] == "12"  # 12.5, printed rounded to even
    assert float(rows["xla"][0]) > 0 and float(rows["paged_gpu"][0]) > 0
