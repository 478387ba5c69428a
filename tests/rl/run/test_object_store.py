"""A run folder on object storage (``trainer.run_dir=gs://...``): a GCS emulator on 127.0.0.1
stands in for Cloud Storage. gcsfs (epath's gs:// backend) and tensorstore (orbax's) both talk
to it, as they would to storage.googleapis.com."""

import json
import logging
import os
import shutil
import socket

import jax
import numpy as np
import pytest
from etils import epath
from omegaconf import OmegaConf

from models import load_params
from rl.run.config import ConfigError
from rl.run.evaluation import restore_run_params
from rl.run.folder import local_mirror, move_folder, run_path
from rl.run.mirror import RunMirror
from rl.run.trainer import build_trainer
from tests.rl.run.test_trainer import LEARN, make_cfg

BUCKET = "bkt"


def _send_generations() -> None:
    """Make the emulator's downloads carry the object's generation headers, as Cloud Storage's
    do: tensorstore (orbax's OCDBT manifests) takes the generation it conditions its next
    write on from them, and without them refuses that write ("Malformed StorageGeneration",
    in ~15 % of saves here)."""
    from gcp_storage_emulator import server
    from gcp_storage_emulator.handlers import objects

    plain = objects.download
    if getattr(plain, "sends_generations", False):
        return

    def download(request, response, storage, *args, **kwargs):
        plain(request, response, storage, *args, **kwargs)
        try:
            obj = storage.get_file_obj(request.params["bucket_name"],
                                       request.params["object_id"])
        except Exception:  # not found: the plain handler answered 404
            return
        response["x-goog-generation"] = obj["generation"]
        response["x-goog-metageneration"] = obj["metageneration"]

    download.sends_generations = True
    objects.download = download  # what objects.get calls for ?alt=media
    for _, methods in server.HANDLERS:  # the routes that name it directly
        for method, handler in list(methods.items()):
            if handler is plain:
                methods[method] = download


@pytest.fixture(scope="module")
def gcs():
    """An in-memory GCS emulator; the environment points gcsfs and tensorstore at it."""
    from gcp_storage_emulator.server import create_server

    _send_generations()
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    server = create_server("127.0.0.1", port, in_memory=True, default_bucket=BUCKET)
    server.start()
    url = f"http://127.0.0.1:{port}"
    env = {"STORAGE_EMULATOR_HOST": url, "TENSORSTORE_GCS_HTTP_URL": url,
           "GOOGLE_AUTH_TOKEN_FOR_TESTING": "emulator",
           # no look for a GCE metadata server off this host (google-auth under gcsfs), and
           # gcsfs's plain client, not its zonal-bucket one, which asks a gRPC control plane
           "NO_GCE_CHECK": "true", "GCSFS_EXPERIMENTAL_ZB_HNS_SUPPORT": "false"}
    before = {k: os.environ.get(k) for k in env}
    os.environ.update(env)
    import google.auth.compute_engine._metadata as gce  # read NO_GCE_CHECK at import

    gce_check, gce._NO_GCE_CHECK = gce._NO_GCE_CHECK, True
    # gcsfs asks the emulator for the bucket's type, which it does not know, at every call
    logging.getLogger("gcsfs").setLevel(logging.ERROR)
    try:
        yield f"gs://{BUCKET}"
    finally:
        server.stop()
        gce._NO_GCE_CHECK = gce_check
        for k, v in before.items():
            os.environ.pop(k) if v is None else os.environ.__setitem__(k, v)


def _records(path: epath.Path) -> list[dict]:
    return [json.loads(x) for x in path.read_text().splitlines()]


def test_a_run_on_gcs_resumes_on_a_fresh_machine_exactly(gcs, tmp_path, char_model,
                                                         monkeypatch):
    """Train 2 steps into gs://, forget the local copy of its log (another machine), resume
    to step 4: the weights equal a straight 4-step run's bit for bit, the bucket holds the
    whole run log (one metrics record per step, both starts) beside the checkpoints, and
    the run's weights read back from the bucket (rl.eval's path) are those weights."""
    monkeypatch.setenv("CHAR_MODEL", str(char_model))
    monkeypatch.chdir(tmp_path)  # a gs:// path taken for a local one would appear here
    common = [*LEARN, "trainer.max_steps=4", "trainer.save_every=2", "trainer.batch_prompts=2",
              "algo.group_size=2", "trainer.max_new_tokens=6", "optim.lr=1e-3",
              "trainer.eval_at_ends=false"]
    straight = build_trainer(make_cfg(tmp_path / "local", *common))
    straight.run()
    ref = jax.device_get(straight.state.params)
    straight.close()

    url = f"{gcs}/runs/a"
    cfg = make_cfg(url, *common)
    first = build_trainer(cfg, OmegaConf.to_yaml(cfg))
    first.run(until=2)
    first.close()
    remote = epath.Path(url)
    assert [r["step"] for r in _records(remote / "metrics.jsonl")] == [0, 1]
    assert (remote / "config.yaml").exists() and (remote / "checkpoints" / "2").is_dir()
    shutil.rmtree(local_mirror(url))  # the resume runs elsewhere

    cfg = make_cfg(url, *common, "trainer.resume=true")
    resumed = build_trainer(cfg, OmegaConf.to_yaml(cfg))
    assert resumed.start_step == 2
    resumed.run()
    got = jax.device_get(resumed.state.params)
    resumed.close()
    jax.tree.map(np.testing.assert_array_equal, got, ref)
    assert [r["step"] for r in _records(remote / "metrics.jsonl")] == [0, 1, 2, 3]
    assert [h["resumed"] for h in _records(remote / "config_history.jsonl")] == [False, True]
    assert sorted(p.name for p in (remote / "checkpoints").iterdir()) == ["2", "4"]
    assert not list(tmp_path.glob("gs*"))
    # rl.eval / rl.export read the run's weights from the bucket too
    _, base, _ = load_params(str(char_model))
    params, step = restore_run_params(url, base)
    assert step == 4
    jax.tree.map(np.testing.assert_array_equal, jax.device_get(params), ref)


def test_a_checkpoint_folder_is_set_aside_on_gcs(gcs):
    """Object storage has no folders to rename: a broken checkpoint is moved file by file."""
    src, dst = epath.Path(f"{gcs}/move/checkpoints/3"), epath.Path(f"{gcs}/move/corrupt/3")
    (src / "state" / "a").write_text("a")
    (src / "meta" / "b").write_text("b")
    move_folder(src, dst)
    assert not src.exists()
    assert (dst / "state" / "a").read_text() == "a" and (dst / "meta" / "b").read_text() == "b"


def test_a_url_whose_storage_package_is_missing_is_named_before_anything_runs(tmp_path):
    if _installed("s3fs"):
        pytest.skip("s3fs is installed here")
    with pytest.raises(ConfigError, match=r"trainer\.run_dir=s3://bkt/run: s3:// needs the "
                                          r"package s3fs: "):
        run_path("s3://bkt/run")


def _installed(name: str) -> bool:
    import importlib.util

    return importlib.util.find_spec(name) is not None


def test_a_failed_copy_is_retried_counted_and_the_final_one_raises(tmp_path, monkeypatch,
                                                                   caplog):
    """The store unreachable: each copy is tried 3 times, then counted and logged, the files
    stay local; the final copy raises, naming the local folder that holds the log."""
    import rl.run.mirror as rm

    monkeypatch.setattr(rm.time, "sleep", lambda s: None)
    local, remote = tmp_path / "local", epath.Path(tmp_path / "remote")
    mirror = RunMirror(local, remote)
    mirror.pull()
    (local / "metrics.jsonl").write_text('{"step": 0}\n')
    calls = []

    def unreachable(self):
        calls.append(1)
        raise ConnectionError("store unreachable")

    monkeypatch.setattr(RunMirror, "_copy", unreachable)
    with caplog.at_level(logging.WARNING, logger="rl.run.mirror"):
        mirror.sync()
    assert len(calls) == rm.TRIES and mirror.failures == 1
    assert "1 failed copies" in caplog.text and str(local) in caplog.text
    with pytest.raises(OSError, match=f"it is whole in {local}"):
        mirror.sync(force=True)
    assert mirror.failures == 2
    monkeypatch.undo()
    mirror.sync(force=True)  # reachable again: everything goes
    assert (remote / "metrics.jsonl").read_text() == '{"step": 0}\n'


def _upload(folder, url: str) -> None:
    for f in folder.iterdir():
        (epath.Path(url) / f.name).write_bytes(f.read_bytes())


def test_weights_on_gcs_load_by_ranges_as_the_local_folder_does(gcs, tmp_path, char_model,
                                                                monkeypatch):
    """model.path=gs://...: the small files (config, tokenizer) are copied into this host's
    cache, the safetensors are not: a slice is one ranged read of the rows it spans, and the
    whole model equals the local folder's bit for bit. A run trains from the bucket."""
    from models.loaders import SafetensorsFiles
    from models.remote import remote_model

    monkeypatch.setenv("RL_MODEL_CACHE", str(tmp_path / "cache"))
    url = f"{gcs}/models/char"
    _upload(char_model, url)
    local_folder, remote = remote_model(url)
    copied = sorted(p.name for p in local_folder.iterdir())
    assert "config.json" in copied and "tokenizer.json" in copied
    assert not any(name.endswith(".safetensors") for name in copied), copied
    near, far = SafetensorsFiles(char_model), SafetensorsFiles(remote)
    name = "model.layers.0.mlp.up_proj.weight"  # [64, 32] float32
    rows, cols = far.shape(name)
    got = far.read(name, (slice(2, 5), slice(8, 16)))
    np.testing.assert_array_equal(got, near.read(name, (slice(2, 5), slice(8, 16))))
    assert far.bytes_read == 3 * cols * 4  # the 3 rows it spans, nothing more
    # a stepped first axis reads every row and cuts in memory
    np.testing.assert_array_equal(far.read(name, (slice(0, rows, 2),)),
                                  near.read(name, (slice(0, rows, 2),)))
    _, from_bucket, tok = load_params(url)
    _, from_disk, _ = load_params(str(char_model))
    jax.tree.map(np.testing.assert_array_equal, jax.device_get(from_bucket),
                 jax.device_get(from_disk))
    assert tok.encode("12+3") == load_params(str(char_model))[2].encode("12+3")
    from models.shapes import model_shapes

    assert model_shapes(url).hidden_size == 32  # rl.plan's plan.model_shapes=gs://...
    with pytest.raises(Exception, match=r"gs://bkt/models/none: no such object or folder"):
        load_params(f"{gcs}/models/none")
    monkeypatch.setenv("CHAR_MODEL", url)
    trainer = build_trainer(make_cfg(tmp_path / "run", *LEARN, "trainer.max_steps=1",
                                     "trainer.batch_prompts=2", "algo.group_size=2",
                                     "trainer.max_new_tokens=4", "trainer.eval_at_ends=false"))
    trainer.run()
    trainer.close()
