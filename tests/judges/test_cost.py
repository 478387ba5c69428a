"""judges.cost: a step's judging, from two counter snapshots, priced by hand."""

import pytest

from judges.cost import cost, prices, step_usage


def test_a_steps_share_and_its_price_by_hand():
    before = {"judge/requests_check": 10, "judge/requests_compare": 4, "judge/cache_hits": 1,
              "judge/backend_calls": 14, "judge/prompt_tokens": 1000,
              "judge/completion_tokens": 100, "retrieval/calls": 3}
    after = {"judge/requests_check": 16, "judge/requests_compare": 8, "judge/cache_hits": 3,
             "judge/backend_calls": 24, "judge/prompt_tokens": 31_000,
             "judge/completion_tokens": 2_100, "retrieval/calls": 5}
    # 6 + 4 requests; 30,000 prompt and 2,000 completion tokens at 0.5 and 2.0 per million:
    # 0.015 + 0.004
    got = step_usage(before, after, 0.5, 2.0)
    assert got == {"judge_step/requests": 10.0, "judge_step/backend_calls": 10.0,
                   "judge_step/cache_hits": 2.0, "judge_step/prompt_tokens": 30_000.0,
                   "judge_step/completion_tokens": 2_000.0,
                   "judge_step/cost": pytest.approx(0.019)}
    assert "judge_step/cost" not in step_usage(before, after)  # no prices: no cost
    assert step_usage({}, {"retrieval/calls": 1}) == {}  # no judge


def test_prices():
    assert cost(2e6, 1e6, 1.0, None) == 2.0 and cost(1, 1, None, None) is None
    assert prices({"price_per_mtok_in": 3, "price_per_mtok_out": None}) == (3.0, None)
    with pytest.raises(ValueError, match="judge.price_per_mtok_out must be >= 0"):
        prices({"price_per_mtok_out": -1})


def test_the_run_summary_line():
    from rl.train import judge_summary

    last = {"judge/requests_check": 7, "judge/requests_compare": 3, "judge/cache_hits": 2,
            "judge/prompt_tokens": 1200, "judge/completion_tokens": 80, "judge/cost": 0.0123}
    assert judge_summary(last) == ("judge: 10 requests, 2 cache hits, 1200 prompt + 80 "
                                   "completion tokens, estimated cost 0.0123 "
                                   "(judge.price_per_mtok_in/out)")
    assert judge_summary({"reward/mean": 1.0}) == ""
