"""trainer.loggers (#20 item 5): TensorBoard and W&B get the same scalars as metrics.jsonl;
W&B runs offline in the run folder (no network) and a resume continues the same W&B run."""

import json
from pathlib import Path

import pytest

from rl.run.trainer import ConfigError, build_trainer
from tests.rl.run.test_trainer import LEARN, make_cfg

BASE = [*LEARN, "trainer.max_steps=2", "trainer.batch_prompts=2", "algo.group_size=2",
        "trainer.max_new_tokens=4", "trainer.eval_at_ends=false", "trainer.save_every=1"]


@pytest.fixture(autouse=True)
def _char_model(char_model, monkeypatch):
    monkeypatch.setenv("CHAR_MODEL", str(char_model))
    monkeypatch.setenv("WANDB_SILENT", "true")
    monkeypatch.delenv("WANDB_API_KEY", raising=False)
    monkeypatch.setenv("NETRC", str(Path("/nonexistent/netrc")))


def _records(path):
    """The protobuf records of a W&B offline run file, read independently of wandb's own
    code: a 7-byte file header (":W&B", magic 0xBEE1, version), then LevelDB log blocks of
    32 KiB whose records carry a 7-byte header (crc32, length, type: 1 full, 2 first,
    3 middle, 4 last)."""
    import struct

    data, pos, block, out, part = path.read_bytes(), 7, 32768, [], b""
    assert data[:4] == b":W&B"
    while pos + 7 <= len(data):
        left = block - pos % block
        if left < 7:  # a block's tail too short for a header is padding
            pos += left
            continue
        _, length, kind = struct.unpack("<IHB", data[pos:pos + 7])
        if kind == 0:
            pos += left
            continue
        payload, pos = data[pos + 7:pos + 7 + length], pos + 7 + length
        part = payload if kind in (1, 2) else part + payload
        if kind in (1, 4):
            out.append(part)
    return out


def _wandb_history(run_dir):
    """The scalars W&B recorded for each step, from its offline run files."""
    from wandb.proto import wandb_internal_pb2

    rows = []
    for f in sorted(Path(run_dir, "wandb").glob("offline-run-*/run-*.wandb")):
        for raw in _records(f):
            rec = wandb_internal_pb2.Record()
            rec.ParseFromString(raw)
            if rec.WhichOneof("record_type") == "history":
                rows.append({i.key or "/".join(i.nested_key): json.loads(i.value_json)
                             for i in rec.history.item})
    return rows


def test_wandb_offline_gets_the_metrics_and_a_resume_continues_its_run(tmp_path):
    run = tmp_path / "r"
    cfg = lambda *more: make_cfg(run, *BASE, "trainer.loggers=[wandb]", *more)  # noqa: E731
    first = build_trainer(cfg("trainer.max_steps=1"))
    first.run()
    first.close()
    run_id = (run / "wandb_id").read_text().strip()
    resumed = build_trainer(cfg("trainer.resume=true",
                                "trainer.resume_allow_changes=[trainer.max_steps]"))
    resumed.run()
    resumed.close()
    assert (run / "wandb_id").read_text().strip() == run_id
    assert all(p.name.endswith(run_id) for p in (run / "wandb").glob("offline-run-*"))
    metrics = [json.loads(x) for x in (run / "metrics.jsonl").read_text().splitlines()]
    history = _wandb_history(run)
    assert [h["_step"] for h in history] == [0, 1]
    for rec, h in zip(metrics, history):
        assert h["reward/mean"] == pytest.approx(rec["reward/mean"])
        assert h["loss"] == pytest.approx(rec["loss"])
    assert not (run / "tb").exists()  # only the loggers listed


def test_online_wandb_without_credentials_is_refused_before_compute(tmp_path):
    with pytest.raises(ConfigError, match=r"trainer\.wandb\.mode.*WANDB_API_KEY"):
        build_trainer(make_cfg(tmp_path / "r", *BASE, "trainer.loggers=[wandb]",
                               "trainer.wandb.mode=online"))
    with pytest.raises(ConfigError, match=r"trainer\.loggers\[1\].*tensorboard"):
        build_trainer(make_cfg(tmp_path / "r", *BASE, "trainer.loggers=[tensorboard,nope]"))
    assert not (tmp_path / "r").exists()
