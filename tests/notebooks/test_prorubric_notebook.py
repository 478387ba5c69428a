"""notebooks/prorubric.ipynb runs end to end on a real 2-step run folder (so it cannot rot)."""

from pathlib import Path
from tests.paths import ROOT

NOTEBOOK = ROOT / "notebooks" / "prorubric.ipynb"
FIXTURE = ROOT / "tests" / "fixtures" / "rubrics" / "perturb_refs.jsonl"


def _short_run(run_dir: Path, model: Path) -> None:
    """task=rubric_chat algo=prorubric judge=rule, 2 steps on the character-level model."""
    from hydra import compose, initialize_config_dir
    from omegaconf import OmegaConf

    from rl.run.trainer import build_trainer

    with initialize_config_dir(config_dir=str(ROOT / "conf"), version_base="1.3"):
        cfg = compose("config", overrides=[
            "model=hf", f"model.path={model}", "task=rubric_chat", "algo=prorubric", "judge=rule",
            f"trainer.run_dir={run_dir}", "trainer.max_steps=2", "trainer.batch_prompts=1",
            "algo.group_size=2", "trainer.max_new_tokens=8", "trainer.progress=false",
            "trainer.loggers=[]", "trainer.save_every=0", "trainer.eval_at_ends=false"])
    cfg = OmegaConf.to_container(cfg, resolve=True)
    trainer = build_trainer(cfg, OmegaConf.to_yaml(cfg))
    trainer.run()
    trainer.close()


def test_prorubric_notebook_executes(tmp_path, char_model, monkeypatch):
    import nbclient
    import nbformat

    from rewards.perturb import main as perturb_main

    run = tmp_path / "runs" / "prorubric_char"
    _short_run(run, char_model)
    assert (run / "metrics.jsonl").exists() and (run / "config.yaml").exists()
    assert perturb_main([str(FIXTURE), str(tmp_path / "perturb"), "judge=rule"]) == 0

    monkeypatch.setenv("PRORUBRIC_RUNS", str(tmp_path / "runs" / "*"))
    monkeypatch.setenv("PRORUBRIC_PERTURB", str(tmp_path / "perturb"))
    nb = nbformat.read(NOTEBOOK, as_version=4)
    client = nbclient.NotebookClient(nb, timeout=240, kernel_name="python3",
                                     resources={"metadata": {"path": str(ROOT / "notebooks")}})
    client.execute()  # raises CellExecutionError on the first failing cell

    def text(cell):
        return "".join(o.get("text", "") + str(o.get("data", {}).get("text/plain", ""))
                       for o in cell.get("outputs", []))

    out = "\n".join(text(c) for c in nb.cells if c.cell_type == "code")
    assert "loaded 1 runs: ['prorubric (prorubric_char)']" in out
    assert "rubric/coverage" in out and "grad_prorubric" in out
    assert "read " + str(tmp_path / "perturb" / "perturb_table.json") in out
    assert "delete_key_recommendation" in out
    images = sum("image/png" in o.get("data", {}) for c in nb.cells if c.cell_type == "code"
                 for o in c.get("outputs", []))
    assert images >= 4
