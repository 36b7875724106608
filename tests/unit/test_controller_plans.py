"""Pure decisions of the controller: who sends weights to whom, and whether vLLM fits."""

import pytest

from rlpost.config import ConfigError, load_config
from rlpost.controller.loop import check_colocated_memory, sync_plan, sync_transport

GIB = 2**30


def cfg_with(*overrides):
    cfg = load_config(["+recipe=quickstart", *overrides])
    return cfg


def test_sync_plan_broadcasts_from_rank0_unless_colocated_on_gpus():
    cfg = cfg_with("rollout.num_workers=3", "cluster.placement=split")
    assert sync_transport(cfg) == "broadcast" and sync_plan(cfg) == {0: [0, 1, 2]}
    cfg = cfg_with("rollout.num_workers=2")  # colocate on the CPU: gloo broadcast
    assert sync_plan(cfg) == {0: [0, 1]}
    cfg.trainer.device = "cuda"  # colocate on GPUs: each rank feeds the actor on its GPU by IPC
    assert sync_transport(cfg) == "ipc" and sync_plan(cfg) == {0: [0], 1: [1]}
    cfg.trainer.world_size, cfg.rollout.num_workers = 4, 2
    assert sync_plan(cfg) == {0: [0], 1: [1]}


def test_colocate_needs_a_trainer_rank_per_rollout_actor():
    with pytest.raises(ConfigError, match="rollout.num_workers=3 must be <= trainer.world_size=2"):
        cfg_with("rollout.num_workers=3")


def test_colocated_vllm_must_fit_beside_the_trainer():
    cfg = cfg_with("rollout.gpu_memory_utilization=0.5")
    cfg.rollout.backend = "vllm"
    check_colocated_memory(cfg, [{"total": 80 * GIB, "free": 70 * GIB, "resident": 30 * GIB}])
    with pytest.raises(ConfigError) as e:
        check_colocated_memory(cfg, [{"total": 80 * GIB, "free": 70 * GIB, "resident": 30 * GIB},
                                     {"total": 80 * GIB, "free": 30 * GIB, "resident": 45 * GIB}])
    msg = str(e.value)
    assert "rollout.gpu_memory_utilization=0.5" in msg and "trainer rank 1" in msg
    assert "rollout.gpu_memory_utilization<=0.42" in msg and "trainer.param_offload=true" in msg
