"""bench.plan_table: the slice walk stops at the first slice that fits, a rerun reuses the
rows it wrote, and the table names the smallest fitting slice (planning faked: the real
``rl.plan.make_plan`` is tested in tests/rl/test_plan.py)."""

import json

import pytest

import bench.plan_table as T


def _fake_row(fits_from: int, calls: list, pinned_prefill_fits_from: int = 0):
    """Rows of a fake plan: every program fits from `fits_from` chips up, except a pinned
    prefill, only from `pinned_prefill_fits_from` chips up (0: as the others)."""
    def row(model, setting, topology, pin=True):
        calls.append(topology if pin else f"{topology} unpinned")
        chips = {"v5e:4x4": 16, "v5e:4x8": 32, "v5e:8x8": 64}.get(topology, 999)
        fits = {n: chips >= fits_from for n in ("prefill", "decode", "reference", "update")}
        if pin and pinned_prefill_fits_from:
            fits["prefill"] = chips >= max(fits_from, pinned_prefill_fits_from)
        return {"model": model, "setting": setting, "topology": topology, "chips": chips,
                "mesh": {"fsdp": chips}, "micro_batches": T.micro_batches(setting, topology),
                "version": T.ROW_VERSION, "prefill_pin_rows": pin,
                "hbm_gib": 16.0, "fits": all(fits.values()),
                "programs": {n: {"peak_gib": (64.0 if pin or n != "prefill" else 32.0) / chips,
                                 "runs": True, "fits": fit} for n, fit in fits.items()},
                "largest_rollout": None}
    return row


def test_the_walk_stops_at_the_first_fitting_slice_and_reruns_reuse_rows(tmp_path, monkeypatch):
    out, calls = tmp_path / "rows.jsonl", []
    monkeypatch.setattr(T, "plan_row", _fake_row(32, calls))
    monkeypatch.setattr(T, "floor_gib", lambda *a: 0.0)  # every slice compiled
    row = T.smallest_fitting("qwen3_8b", "groups64", "v5e", out)
    assert row["topology"] == "v5e:4x8" and calls == ["v5e:4x4", "v5e:4x8"]
    assert [json.loads(x)["topology"] for x in out.read_text().splitlines()] == calls
    again = T.smallest_fitting("qwen3_8b", "groups64", "v5e", out)  # nothing compiled again
    assert again == row and calls == ["v5e:4x4", "v5e:4x8"]


def test_none_fits_is_said_and_the_table_lists_the_smallest(tmp_path, monkeypatch):
    calls = []
    monkeypatch.setattr(T, "plan_row", _fake_row(10**6, calls))
    monkeypatch.setattr(T, "floor_gib", lambda *a: 0.0)
    assert T.smallest_fitting("qwen3_14b", "search_r1", "v5e", tmp_path / "r.jsonl") is None
    assert calls == T.SLICES["v5e"]
    monkeypatch.setattr(T, "plan_row", _fake_row(16, []))
    fit = T.smallest_fitting("qwen3_4b", "groups64", "v5e", tmp_path / "s.jsonl")
    text = T.table([("qwen3_4b", "groups64", "v5e", fit), ("qwen3_14b", "search_r1", "v5e",
                                                           None)])
    assert ("| qwen3_4b | groups64 | v5e | `v5e:4x4` | 16 | 4 | pinned | 4.0 / 4.0 / 4.0 / 4.0 "
            "(HBM 16.0) |") in text
    assert "| qwen3_14b | search_r1 | v5e | none of v5e:4x4, v5e:4x8" in text


def test_search_r1_budget_is_four_turns_of_500_with_three_observations():
    assert "plan.response_budget=3500" in T.SETTINGS["search_r1"]
    assert "trainer.batch_prompts=512" in T.SETTINGS["search_r1"]
    assert "algo.group_size=5" in T.COMMON


def test_the_shape_floor_by_hand():
    """Qwen3-4B (model card: 36 layers, 8 KV heads of 128 dims) at groups64 on v5e:4x4: 14
    bytes per parameter over 16 chips, plus 320 / 16 = 20 rows of a bfloat16 cache of 256 +
    1,024 slots."""
    from models.shapes import model_shapes

    params = model_shapes("qwen3_4b").num_params
    row = 1280 * 36 * 2 * 8 * 128 * 2
    want = (14 * params / 16 + 20 * row) / 2**30
    assert T.floor_gib("qwen3_4b", "groups64", "v5e:4x4") == pytest.approx(want)
    assert 6.5 < want < 7.0  # 2.81 train state + 0.47 reference weights + 3.52 cache


def test_slices_the_shapes_rule_out_are_recorded_not_compiled(tmp_path, monkeypatch):
    """search_r1 (2,560 trajectories x 3,756 slots) needs an 82.5 GiB cache per chip on 16
    v5e chips, 41 on 32, 21 on 64: only v5e:8x16 (10.3 GiB) is compiled."""
    out, calls = tmp_path / "rows.jsonl", []
    monkeypatch.setattr(T, "plan_row", _fake_row(128, calls))
    row = T.smallest_fitting("qwen3_4b", "search_r1", "v5e", out)
    assert calls == ["v5e:8x16"] and row["topology"] == "v5e:8x16"
    rows = [json.loads(x) for x in out.read_text().splitlines()]
    assert [r["topology"] for r in rows] == ["v5e:4x4", "v5e:4x8", "v5e:8x8", "v5e:8x16"]
    cache16 = 160 * 3756 * 36 * 2 * 8 * 128 * 2 / 2**30
    assert rows[0]["floor_gib"] > cache16 and not rows[0]["fits"]
    assert "not compiled" in rows[0]["skipped"] and "> 16.0 GiB HBM" in rows[0]["skipped"]


def test_the_micro_batch_count_is_the_settings_unless_it_leaves_filler_on_the_slice():
    """search_r1: 2 mini-batches of 1,280 rows. On 16 chips 80 rows per shard cut into its 16
    micro-batches; on 128 chips 10 rows per shard, and 10 micro-batches (one row each) is the
    largest count <= 16 dividing 10; groups64 on 64 chips: 5 rows per shard, only 1 of 1..4."""
    assert T.micro_batches("search_r1", "v5p:2x2x4") == 16
    assert T.micro_batches("search_r1", "v5e:8x16") == 10
    assert T.micro_batches("groups64", "v5e:4x4") == 4
    assert T.micro_batches("groups64", "v5e:8x8") == 1
    keys = T.overrides("qwen3_4b", "search_r1", "v5e:8x16")
    assert "trainer.micro_batches=10" in keys and "trainer.micro_batches=16" not in keys


def test_rows_of_another_version_or_micro_batch_count_are_planned_again(tmp_path):
    """Reused: this version's row planned with the slice's count (16 on v5p:2x2x4), and a
    skipped row of any version. Planned again: a row with 16 micro-batches on v5e:8x16 (the
    slice's count is 10), and a row of version 1 (no version field)."""
    out = tmp_path / "rows.jsonl"
    v = T.ROW_VERSION
    rows = [{"topology": "v5e:8x16", "micro_batches": 16, "version": v},
            {"topology": "v5p:2x2x4", "micro_batches": 16, "version": v},
            {"topology": "v5p:2x2x4", "micro_batches": 16, "version": v,
             "prefill_pin_rows": False},
            {"topology": "v5e:16x16", "micro_batches": 5},
            {"topology": "v5e:4x4", "skipped": "floor"}]
    out.write_text("\n".join(json.dumps({"model": "m", "setting": "search_r1", "fits": False,
                                          **r}) for r in rows) + "\n")
    assert set(T.done_rows(out)) == {("m", "search_r1", "v5p:2x2x4", True),
                                     ("m", "search_r1", "v5p:2x2x4", False),
                                     ("m", "search_r1", "v5e:4x4", True)}


def test_a_slice_whose_pinned_prefill_misses_is_planned_with_the_compilers_layout(
        tmp_path, monkeypatch):
    """Everything fits from 32 chips up but the pinned prefill only from 64: on v5e:4x8 the
    unpinned plan is the row (with the pinned prefill's peak, 64/32 = 2.0 GiB); on v5e:4x4
    more than the prefill misses, so it is not planned again. A rerun plans nothing, and a
    pinned row already in the file (as rows written before the layout was a key) is not
    planned again, only the unpinned one."""
    out, calls = tmp_path / "rows.jsonl", []
    monkeypatch.setattr(T, "plan_row", _fake_row(32, calls, pinned_prefill_fits_from=64))
    monkeypatch.setattr(T, "floor_gib", lambda *a: 0.0)
    row = T.smallest_fitting("qwen3_8b", "groups64", "v5e", out)
    assert calls == ["v5e:4x4", "v5e:4x8", "v5e:4x8 unpinned"]
    assert row["topology"] == "v5e:4x8" and row["prefill_pin_rows"] is False
    assert row["pinned_prefill_gib"] == 2.0 and row["programs"]["prefill"]["peak_gib"] == 1.0
    assert T.smallest_fitting("qwen3_8b", "groups64", "v5e", out) == row
    assert len(calls) == 3
    assert "| `v5e:4x8` | 32 | 2 | compiler's | 1.0 / 2.0 / 2.0 / 2.0 (HBM 16.0) |" in T.table(
        [("qwen3_8b", "groups64", "v5e", row)])
    old = [json.loads(x) for x in out.read_text().splitlines()][1]  # v5e:4x8, pinned
    del old["prefill_pin_rows"]
    out.write_text(json.dumps(old) + "\n")
    calls.clear()
    T.slice_row("qwen3_8b", "groups64", "v5e:4x8", out, None, plan=True)
    assert calls == ["v5e:4x8 unpinned"]


def test_a_plan_past_its_time_is_stopped_and_said(tmp_path, monkeypatch):
    import sys

    assert T.run_bounded([sys.executable, "-c", "import time; time.sleep(30)"], 0.5) is None
    assert T.run_bounded([sys.executable, "-c", "print('noise'); print('{\"a\": 1}')"],
                         30) == {"a": 1}
    with pytest.raises(RuntimeError, match="failed"):
        T.run_bounded([sys.executable, "-c", "raise SystemExit(3)"], 30)
    monkeypatch.setattr(T, "bounded_plan_row", lambda *a, **k: None)
    monkeypatch.setattr(T, "floor_gib", lambda *a: 0.0)
    row = T.smallest_fitting("qwen3_14b", "groups64", "v5p", tmp_path / "r.jsonl", 0.1)
    assert row == {"unfinished": "v5p:2x2x1", "minutes": 0.1}
    assert not (tmp_path / "r.jsonl").exists()
    text = T.table([("qwen3_14b", "groups64", "v5p", row)])
    assert "not known: `v5p:2x2x1` not planned within 0.1 min" in text


def test_the_table_alone_plans_nothing_and_says_where_the_rows_stop(tmp_path, monkeypatch):
    out, calls = tmp_path / "rows.jsonl", []
    monkeypatch.setattr(T, "plan_row", _fake_row(32, calls))
    monkeypatch.setattr(T, "floor_gib", lambda *a: 0.0)
    assert T.smallest_fitting("qwen3_8b", "groups64", "v5e", out, plan=False) == {
        "unplanned": "v5e:4x4"}
    T.smallest_fitting("qwen3_8b", "groups64", "v5e", out)
    calls.clear()
    row = T.smallest_fitting("qwen3_8b", "groups64", "v5e", out, plan=False)
    assert row["topology"] == "v5e:4x8" and calls == []
    text = T.table([("qwen3_4b", "search_r1", "v5p", {"unplanned": "v5p:2x2x4"})])
    assert "not planned yet from `v5p:2x2x4` up" in text


def test_the_table_shows_older_rows_marked_and_a_rerun_plans_them_again(tmp_path, monkeypatch):
    """Rows of an older ROW_VERSION: the table alone still shows them, the cell naming the
    walk's older rows; a key with rows of both versions shows the current one; a rerun that
    plans plans them again."""
    out, calls = tmp_path / "rows.jsonl", []
    monkeypatch.setattr(T, "plan_row", _fake_row(32, calls))
    monkeypatch.setattr(T, "floor_gib", lambda *a: 0.0)
    T.smallest_fitting("qwen3_8b", "groups64", "v5e", out)          # v5e:4x4 misses, 4x8 fits
    old = [dict(json.loads(x), version=T.ROW_VERSION - 1) for x in out.read_text().splitlines()]
    out.write_text("".join(json.dumps(r) + "\n" for r in old))
    calls.clear()
    row = T.smallest_fitting("qwen3_8b", "groups64", "v5e", out, plan=False)
    assert calls == [] and row["topology"] == "v5e:4x8"
    v = T.ROW_VERSION - 1
    assert (f"| `v5e:4x8` (rows of older code: v5e:4x4 v{v}, v5e:4x8 v{v}) | 32 |"
            in T.table([("qwen3_8b", "groups64", "v5e", row)]))
    assert T.smallest_fitting("qwen3_8b", "groups64", "v5e", out)["topology"] == "v5e:4x8"
    assert calls == ["v5e:4x4", "v5e:4x8"]                          # planned again
    row = T.smallest_fitting("qwen3_8b", "groups64", "v5e", out, plan=False)
    assert "older_rows" not in row and "older code" not in T.table(
        [("qwen3_8b", "groups64", "v5e", row)])
