"""Checkpoints: a run folder written before the constant rng entry was dropped still restores."""

import jax
import jax.numpy as jnp
import numpy as np

from rl.run.checkpoint import Checkpointer


def test_a_checkpoint_with_the_old_rng_entry_restores_without_it(tmp_path):
    state = {"params": {"w": jnp.arange(6.0).reshape(2, 3)}, "step": jnp.asarray(4)}
    old = Checkpointer(tmp_path / "ck")
    old.save(4, {"state": state, "rng": jax.random.key_data(jax.random.key(7))},
             {"step": 4, "data_position": 4})
    old.close()
    ck = Checkpointer(tmp_path / "ck")
    like = {"state": jax.tree.map(jnp.zeros_like, state)}
    restored, meta = ck.restore(4, like)
    ck.close()
    assert set(restored) == {"state"} and meta["step"] == 4
    np.testing.assert_array_equal(restored["state"]["params"]["w"], state["params"]["w"])


# ------------------------------------------------------------------------------ integrity

import json  # noqa: E402
import logging  # noqa: E402

import pytest  # noqa: E402

from rl.run.checkpoint import CheckpointError  # noqa: E402


def _state(step):
    w = np.linspace(-1.0, 1.0, 64 * 64, dtype=np.float32).reshape(64, 64) * step
    return {"state": {"params": {"w": jnp.asarray(w)}, "step": jnp.asarray(step)}}


def _saved(tmp_path, steps=(1, 2), keep=3):
    ck = Checkpointer(tmp_path / "checkpoints", keep=keep)
    for s in steps:
        ck.save(s, _state(s), {"step": s, "reward_state": {"rubrics": ["r1", f"r{s}"]}})
    ck.close()
    return Checkpointer(tmp_path / "checkpoints", keep=keep)


def _largest_array_file(step_dir):
    files = [p for p in (step_dir / "state").rglob("*") if p.is_file() and "d" in p.parts]
    return max(files, key=lambda p: p.stat().st_size)


def _flip_8_bytes(path):
    data = bytearray(path.read_bytes())
    mid = len(data) // 2
    data[mid:mid + 8] = bytes(b ^ 0xFF for b in data[mid:mid + 8])
    path.write_bytes(bytes(data))


def _accept(step, meta):
    pass


def _restore_latest(ck):
    step, state, meta = ck.restore_latest_valid(_state(0), _accept)
    return step, jax.device_get(state), meta


def test_flipped_bytes_in_the_latest_arrays_fall_back_to_the_previous_checkpoint(
        tmp_path, caplog):
    ck = _saved(tmp_path)
    _flip_8_bytes(_largest_array_file(tmp_path / "checkpoints" / "2"))
    with caplog.at_level(logging.WARNING, "rl.run.checkpoint"):
        step, state, meta = _restore_latest(ck)
    assert step == 1 and meta["reward_state"] == {"rubrics": ["r1", "r1"]}
    np.testing.assert_array_equal(state["state"]["params"]["w"], _state(1)["state"]["params"]["w"])
    warning = caplog.text
    assert "step 2" in warning and str(tmp_path / "checkpoints" / "2") in warning
    assert "Resuming from step 1" in warning and "(1) are trained again" in warning
    # the broken checkpoint is kept aside, not deleted; the next save of step 2 works
    assert (tmp_path / "checkpoints_corrupt" / "2").is_dir()
    assert ck.latest_step() == 1
    ck.save(2, _state(2), {"step": 2})
    assert ck.latest_step() == 2
    ck.close()


def test_flipped_bytes_in_the_only_checkpoint_are_an_error_naming_the_folder(tmp_path):
    ck = _saved(tmp_path, steps=(1,))
    _flip_8_bytes(_largest_array_file(tmp_path / "checkpoints" / "1"))
    with pytest.raises(CheckpointError, match="no valid checkpoint") as e:
        _restore_latest(ck)
    ck.close()
    assert str(tmp_path / "checkpoints") in str(e.value) and "step 1" in str(e.value)
    assert (tmp_path / "checkpoints" / "1").is_dir()  # nothing moved or deleted


@pytest.mark.parametrize("damage", ["emptied", "truncated"])
def test_an_emptied_or_truncated_latest_checkpoint_falls_back_with_a_named_warning(
        tmp_path, caplog, damage):
    ck = _saved(tmp_path)
    latest = tmp_path / "checkpoints" / "2"
    for p in [p for p in latest.rglob("*") if p.is_file()]:
        if damage == "emptied":
            p.unlink()
        else:
            p.write_bytes(p.read_bytes()[: p.stat().st_size // 2])
    if damage == "emptied":
        for d in sorted((p for p in latest.rglob("*") if p.is_dir()), reverse=True):
            d.rmdir()
        assert latest.is_dir() and not any(latest.iterdir())
    with caplog.at_level(logging.WARNING, "rl.run.checkpoint"):
        step, _, _ = _restore_latest(ck)
    ck.close()
    assert step == 1
    assert f"step 2 ({latest})" in caplog.text and "trained again" in caplog.text


def test_a_changed_reward_state_fails_its_checksum(tmp_path):
    """The rubric memory is JSON: an edit that still parses is caught by its checksum."""
    ck = _saved(tmp_path)
    meta_file = next(p for p in (tmp_path / "checkpoints" / "2" / "meta").rglob("*")
                     if p.is_file() and p.name != "commit_success.txt")
    meta = json.loads(meta_file.read_text())
    meta["reward_state"]["rubrics"][1] = "tampered"
    meta_file.write_text(json.dumps(meta))
    with pytest.raises(CheckpointError, match="reward state / rubric memory"):
        ck.restore_verified(2, _state(0))
    step, _, _ = _restore_latest(ck)
    ck.close()
    assert step == 1


def test_keep_none_keeps_every_checkpoint(tmp_path):
    ck = _saved(tmp_path, steps=(1, 2, 3, 4), keep=None)
    assert ck.step_dirs() == [4, 3, 2, 1]
    ck.close()
    ck = _saved(tmp_path / "one", steps=(1, 2, 3), keep=1)
    assert ck.step_dirs() == [3]  # the newest one is never deleted
    ck.close()


# ------------------------------------------------------------------------ layout-free sums

from rl.run.checkpoint import add_sums, shard_sum  # noqa: E402


def _lowbias32(h: int) -> int:  # C. Wellons' lowbias32, in Python integers
    h ^= h >> 16
    h = (h * 0x7FEB352D) & 0xFFFFFFFF
    h ^= h >> 15
    h = (h * 0x846CA68B) & 0xFFFFFFFF
    return h ^ (h >> 16)


def _reference_sum(a: np.ndarray) -> str:
    """The two lanes element by element: sum mix(bits + mix(i)), sum mix(bits ^ mix(i ^ c))."""
    width = {4: np.uint32, 2: np.uint16, 1: np.uint8}[a.dtype.itemsize]
    bits = [int(b) for b in np.ascontiguousarray(a).view(width).reshape(-1)]
    one = sum(_lowbias32((b + _lowbias32(i)) & 0xFFFFFFFF) for i, b in enumerate(bits))
    two = sum(_lowbias32(b ^ _lowbias32(i ^ 0x9E3779B9)) for i, b in enumerate(bits))
    return f"{one % 2**32:08x}{two % 2**32:08x}"


@pytest.mark.parametrize("dtype", ["float32", "bfloat16", "int8", "bool"])
def test_shard_sums_of_any_cut_add_up_to_the_whole_arrays_sum(dtype):
    """A resumed job may cut its arrays differently from the one that saved them: the shard
    sums of rows, of columns and of blocks each add up to the whole array's sum, which equals
    an element-by-element reference."""
    import ml_dtypes

    rng = np.random.default_rng(0)
    a = rng.standard_normal((6, 8)).astype(ml_dtypes.bfloat16 if dtype == "bfloat16" else
                                           dtype if dtype != "bool" else np.float32)
    a = a > 0 if dtype == "bool" else a
    whole = shard_sum(a, (slice(None), slice(None)), a.shape)
    assert whole == _reference_sum(a)
    cuts = {"rows": [(slice(0, 3), slice(None)), (slice(3, 6), slice(None))],
            "columns": [(slice(None), slice(0, 2)), (slice(None), slice(2, 8))],
            "blocks": [(slice(r, r + 3), slice(c, c + 4)) for r in (0, 3) for c in (0, 4)]}
    for cut in cuts.values():
        assert add_sums(shard_sum(a[i], i, a.shape) for i in cut) == whole
    changed = a.copy()
    changed[4, 5] = changed[4, 1]  # one element, set to a value the array holds elsewhere
    if (changed != a).any():
        assert shard_sum(changed, (slice(None), slice(None)), a.shape) != whole
    swapped = a.copy()
    swapped[[0, 5]] = swapped[[5, 0]]  # two rows exchanged: the same values elsewhere
    if (swapped != a).any():
        assert shard_sum(swapped, (slice(None), slice(None)), a.shape) != whole


def test_a_large_shard_is_summed_in_pieces_with_the_same_result(monkeypatch):
    import rl.run.checkpoint as ck

    a = np.arange(40 * 3, dtype=np.float32).reshape(40, 3)
    whole = shard_sum(a, (slice(10, 50), slice(None)), (60, 3))
    monkeypatch.setattr(ck, "SUM_ROWS", 7)  # 2 rows of 3 per piece: 20 pieces
    assert shard_sum(a, (slice(10, 50), slice(None)), (60, 3)) == whole
