"""mesh.local_device_ids and the idle-GPU check (core.local_devices), from the environment
variables SLURM and Open MPI set, simulated here: no GPU cluster has run this."""

import pytest

from core.local_devices import (
    idle_gpus,
    local_device_ids,
    processes_per_node,
    tasks_on_node,
    visible_gpus,
)

SLURM = {"SLURM_JOB_ID": "7", "SLURM_NODEID": "0"}


@pytest.mark.parametrize("env, want", [
    # 1. one process per node seeing the node's 8 GPUs: all of them (JAX's choice: [0] alone)
    ({**SLURM, "SLURM_TASKS_PER_NODE": "1(x2)", "SLURM_LOCALID": "0",
      "CUDA_VISIBLE_DEVICES": "0,1,2,3,4,5,6,7"}, list(range(8))),
    # 2. one process per GPU, each seeing all 8: process 3 takes GPU 3 (JAX's choice)
    ({**SLURM, "SLURM_TASKS_PER_NODE": "8(x2)", "SLURM_LOCALID": "3",
      "CUDA_VISIBLE_DEVICES": "0,1,2,3,4,5,6,7"}, [3]),
    # 3. one process per GPU, each bound to its own (--gpus-per-task=1): the one it sees, 0
    #    (JAX's choice, 3, does not exist for it)
    ({**SLURM, "SLURM_TASKS_PER_NODE": "8(x2)", "SLURM_LOCALID": "3",
      "CUDA_VISIBLE_DEVICES": "3"}, [0]),
    # two processes per node sharing 8: a half each; the second node's count from "8,2"
    ({**SLURM, "SLURM_TASKS_PER_NODE": "2", "SLURM_LOCALID": "1",
      "SLURM_STEP_GPUS": "0-7"}, [4, 5, 6, 7]),
    ({**SLURM, "SLURM_NODEID": "1", "SLURM_TASKS_PER_NODE": "8,2", "SLURM_LOCALID": "0",
      "SLURM_GPUS_ON_NODE": "2"}, [0]),
    # Open MPI: its local size and rank
    ({"OMPI_COMM_WORLD_LOCAL_SIZE": "4", "OMPI_COMM_WORLD_LOCAL_RANK": "2",
      "CUDA_VISIBLE_DEVICES": "0,1,2,3"}, [2]),
    # no GPUs in the environment (TPU slice, CPU processes) or no managed job: JAX decides
    ({**SLURM, "SLURM_TASKS_PER_NODE": "1", "SLURM_LOCALID": "0"}, None),
    ({"CUDA_VISIBLE_DEVICES": "0,1"}, None),
])
def test_auto_covers_each_node_once_in_every_launch_style(env, want):
    assert local_device_ids("auto", env) == want


def test_explicit_and_jax_settings_and_bad_values():
    env = {**SLURM, "SLURM_TASKS_PER_NODE": "1", "SLURM_LOCALID": "0",
           "CUDA_VISIBLE_DEVICES": "0,1"}
    assert local_device_ids("jax", env) is None and local_device_ids([1, 0], env) == [1, 0]
    with pytest.raises(ValueError, match="mesh.local_device_ids: expected distinct"):
        local_device_ids([0, 0], env)
    uneven = {**SLURM, "SLURM_TASKS_PER_NODE": "3", "SLURM_LOCALID": "0",
              "CUDA_VISIBLE_DEVICES": "0,1,2,3"}
    with pytest.raises(ValueError, match="3 processes share this node and this one sees 4"):
        local_device_ids("auto", uneven)


def test_the_environments_counts_by_hand():
    assert visible_gpus({"CUDA_VISIBLE_DEVICES": ""}) == 0
    assert visible_gpus({"SLURM_STEP_GPUS": "0-3,6"}) == 5
    assert tasks_on_node({"SLURM_NODEID": "2", "SLURM_TASKS_PER_NODE": "4(x2),1"}) == 1
    assert tasks_on_node({"SLURM_STEP_TASKS_PER_NODE": "2", "SLURM_TASKS_PER_NODE": "8"}) == 2


def test_processes_per_node_only_where_every_node_holds_as_many():
    """The mesh groups processes into nodes by this count, so every process must read the
    same: the job-wide lists when uniform, nothing otherwise."""
    assert processes_per_node({**SLURM, "SLURM_TASKS_PER_NODE": "8(x2)"}) == 8
    assert processes_per_node({**SLURM, "SLURM_NODEID": "1",
                               "SLURM_TASKS_PER_NODE": "8,2"}) is None
    assert processes_per_node({"SLURM_STEP_TASKS_PER_NODE": "4(x3)",
                               "SLURM_TASKS_PER_NODE": "8(x3)"}) == 4
    assert processes_per_node({"SLURM_NTASKS_PER_NODE": "2"}) == 2
    assert processes_per_node({"OMPI_COMM_WORLD_LOCAL_SIZE": "4",
                               "OMPI_COMM_WORLD_SIZE": "16"}) == 4
    assert processes_per_node({"OMPI_COMM_WORLD_LOCAL_SIZE": "4",
                               "OMPI_COMM_WORLD_SIZE": "6"}) is None
    assert processes_per_node({}) is None


def test_idle_gpus_are_named_with_their_numbers():
    # the guide's failure: srun --ntasks-per-node=1 on 8-GPU nodes, JAX's one GPU per process
    env = {**SLURM, "SLURM_GPUS_ON_NODE": "8", "SLURM_TASKS_PER_NODE": "1(x2)"}
    why = idle_gpus(env, used_per_process=1)
    assert "offers 8 GPUs" in why and "use 1 each (1 in all): 7 would stay idle" in why
    assert idle_gpus(env, used_per_process=8) is None
    assert idle_gpus({**env, "SLURM_TASKS_PER_NODE": "8(x2)"}, 1) is None
    assert idle_gpus({"SLURM_TASKS_PER_NODE": "1"}, 1) is None  # no GPUs: nothing to compare


def test_join_cluster_hands_the_chosen_devices_to_jax(monkeypatch):
    """The devices reach jax.distributed.initialize (its local_device_ids), captured here
    instead of forming a job."""
    import jax

    from core import cluster

    seen = {}
    monkeypatch.setattr(jax.distributed, "is_initialized", lambda: False)
    monkeypatch.setattr(jax.distributed, "initialize", lambda **kw: seen.update(kw))
    monkeypatch.setattr(cluster, "_wait_for_coordinator", lambda job, t: None)
    cluster.join_cluster("127.0.0.1:1234", 2, 1, local_device_ids=[0, 1, 2, 3])
    assert seen["local_device_ids"] == [0, 1, 2, 3] and seen["process_id"] == 1


def test_the_job_stops_on_idle_gpus_unless_allowed_and_checks_its_size():
    import dataclasses

    from rl.run.config import ConfigError, MeshConfig, check_devices

    mesh = MeshConfig(shape={}, coordinator=None, num_processes=None, process_id=None,
                      connect_timeout_s=1, heartbeat_timeout_s=1, wait_timeout_s=1)
    env = {**SLURM, "SLURM_GPUS_ON_NODE": "8", "SLURM_TASKS_PER_NODE": "1(x2)"}
    with pytest.raises(ConfigError, match="mesh.allow_idle_devices: this node offers 8 GPUs"):
        check_devices(mesh, env, local=1, total=2, processes=2)
    check_devices(dataclasses.replace(mesh, allow_idle_devices=True), env, 1, 2, 2)
    check_devices(mesh, env, local=8, total=16, processes=2)
    with pytest.raises(ConfigError, match=r"mesh.expect_devices: =16, but the job has 2 devices "
                                          r"\(2 process\(es\), 1 on this one\)"):
        check_devices(dataclasses.replace(mesh, allow_idle_devices=True, expect_devices=16),
                      env, 1, 2, 2)


def test_a_run_that_would_leave_gpus_idle_stops_before_loading(monkeypatch, tmp_path):
    """rl.train in a simulated SLURM step whose node offers one GPU more than this process
    uses: it stops at start, before the model or the data is read, naming the numbers."""
    import jax

    from rl.run.config import ConfigError
    from rl.run.trainer import build_trainer
    from tests.rl.rewarders.test_arbor_e2e import compose_cfg

    n = jax.local_device_count()
    for key, value in {"SLURM_JOB_ID": "7", "SLURM_GPUS_ON_NODE": str(n + 1),
                       "SLURM_TASKS_PER_NODE": "1", "SLURM_LOCALID": "0"}.items():
        monkeypatch.setenv(key, value)
    with pytest.raises(ConfigError, match=f"offers {n + 1} GPUs .* 1 would stay idle"):
        build_trainer(compose_cfg("model=tiny", f"trainer.run_dir={tmp_path / 'run'}"))
    assert not (tmp_path / "run").exists()
