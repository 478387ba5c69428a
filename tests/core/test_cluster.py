"""core.cluster: which job a process joins, from explicit settings or the cluster JAX finds.

Only the decision is tested here (joining needs a fresh process: tests/rl/run/test_multihost.py
starts 2 processes with nothing but SLURM's variables)."""

import pytest

from core.cluster import ClusterJob, job_settings

# what JAX's cluster detection reads, cleared so the machine running the tests cannot leak a job
CLUSTER_VARS = ("SLURM_JOB_ID", "SLURM_NTASKS", "SLURM_PROCID", "SLURM_LOCALID",
                "SLURM_STEP_NODELIST", "OMPI_MCA_orte_hnp_uri", "KUBERNETES_SERVICE_HOST",
                "TPU_WORKER_HOSTNAMES", "JAX_COORDINATOR_ADDRESS", "JAX_COORDINATOR_PORT")


@pytest.fixture
def no_cluster(monkeypatch):
    for name in CLUSTER_VARS:
        monkeypatch.delenv(name, raising=False)
    return monkeypatch


def _slurm(monkeypatch, tasks: int, rank: int, job_id: int = 4242) -> None:
    for name, value in (("SLURM_JOB_ID", job_id), ("SLURM_NTASKS", tasks),
                        ("SLURM_PROCID", rank), ("SLURM_LOCALID", rank),
                        ("SLURM_STEP_NODELIST", "node[007-009],login1")):
        monkeypatch.setenv(name, str(value))


def test_a_lone_process_with_no_cluster_stays_single(no_cluster):
    assert job_settings(None, None, None) is None
    assert job_settings(None, 1, 0) is None


def test_a_slurm_job_is_found_from_its_variables_alone(no_cluster):
    _slurm(no_cluster, tasks=4, rank=2)
    # JAX's SLURM rule: the step's first node, port 61440 + job id mod 4096 (4242 -> 146)
    assert job_settings(None, None, None) == ClusterJob("slurm", "node007:61586", 4, 2)
    no_cluster.setenv("JAX_COORDINATOR_PORT", "5555")
    assert job_settings(None, None, None).coordinator == "node007:5555"


def test_a_slurm_step_of_one_task_stays_single(no_cluster):
    _slurm(no_cluster, tasks=1, rank=0)
    assert job_settings(None, None, None) is None


def test_explicit_settings_win_over_the_cluster_found(no_cluster):
    _slurm(no_cluster, tasks=4, rank=2)
    assert job_settings("10.0.0.1:1234", 2, 1) == ClusterJob(
        "mesh.coordinator", "10.0.0.1:1234", 2, 1)
    no_cluster.setenv("JAX_COORDINATOR_ADDRESS", "10.0.0.2:99")
    # the variable names no counts: JAX takes them from the cluster when it joins
    assert job_settings(None, None, None) == ClusterJob(
        "JAX_COORDINATOR_ADDRESS", "10.0.0.2:99", None, None)


def test_a_job_size_without_an_address_or_a_cluster_is_refused_by_key(no_cluster):
    with pytest.raises(ValueError, match=r"^mesh\.coordinator: .*JAX found no cluster"):
        job_settings(None, 2, 1)
    _slurm(no_cluster, tasks=4, rank=9)
    with pytest.raises(ValueError, match=r"^mesh\.process_id: must be in \[0, "):
        job_settings(None, None, None)
