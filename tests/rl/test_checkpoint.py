"""Checkpoints: a run folder written before the constant rng entry was dropped still restores."""

import jax
import jax.numpy as jnp
import numpy as np

from rl.checkpoint import Checkpointer


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
