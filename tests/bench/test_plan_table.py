"""bench.plan_table: the slice walk stops at the first slice that fits, a rerun reuses the
rows it wrote, and the table names the smallest fitting slice (planning faked: the real
``rl.plan.make_plan`` is tested in tests/rl/test_plan.py)."""

import json

import bench.plan_table as T


def _fake_row(fits_from: int, calls: list):
    def row(model, setting, topology):
        calls.append(topology)
        chips = {"v5e:4x4": 16, "v5e:4x8": 32, "v5e:8x8": 64}.get(topology, 999)
        return {"model": model, "setting": setting, "topology": topology, "chips": chips,
                "mesh": {"fsdp": chips}, "hbm_gib": 16.0, "fits": chips >= fits_from,
                "programs": {n: {"peak_gib": 64.0 / chips * 16 / 16, "runs": True,
                                 "fits": chips >= fits_from}
                             for n in ("prefill", "decode", "reference", "update")},
                "largest_rollout": None}
    return row


def test_the_walk_stops_at_the_first_fitting_slice_and_reruns_reuse_rows(tmp_path, monkeypatch):
    out, calls = tmp_path / "rows.jsonl", []
    monkeypatch.setattr(T, "plan_row", _fake_row(32, calls))
    row = T.smallest_fitting("qwen3_8b", "groups64", "v5e", out)
    assert row["topology"] == "v5e:4x8" and calls == ["v5e:4x4", "v5e:4x8"]
    assert [json.loads(x)["topology"] for x in out.read_text().splitlines()] == calls
    again = T.smallest_fitting("qwen3_8b", "groups64", "v5e", out)  # nothing compiled again
    assert again == row and calls == ["v5e:4x4", "v5e:4x8"]


def test_none_fits_is_said_and_the_table_lists_the_smallest(tmp_path, monkeypatch):
    calls = []
    monkeypatch.setattr(T, "plan_row", _fake_row(10**6, calls))
    assert T.smallest_fitting("qwen3_14b", "search_r1", "v5e", tmp_path / "r.jsonl") is None
    assert calls == T.SLICES["v5e"]
    monkeypatch.setattr(T, "plan_row", _fake_row(16, []))
    fit = T.smallest_fitting("qwen3_4b", "groups64", "v5e", tmp_path / "s.jsonl")
    text = T.table([("qwen3_4b", "groups64", "v5e", fit), ("qwen3_14b", "search_r1", "v5e",
                                                           None)])
    assert "| qwen3_4b | groups64 | v5e | `v5e:4x4` | 16 | 4.0 / 4.0 / 4.0 / 4.0 (HBM 16.0) |" \
        in text
    assert "| qwen3_14b | search_r1 | v5e | none of v5e:4x4, v5e:4x8" in text


def test_search_r1_budget_is_four_turns_of_500_with_three_observations():
    assert "plan.response_budget=3500" in T.SETTINGS["search_r1"]
    assert "trainer.batch_prompts=512" in T.SETTINGS["search_r1"]
    assert "algo.group_size=5" in T.COMMON
