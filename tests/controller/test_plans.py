"""Pure decisions of the controller: who sends weights to whom, and whether vLLM fits."""

import pytest

from rlpost.config import ConfigError, load_config
from rlpost.controller.weights import check_colocated_memory, sync_plan, sync_transport

GIB = 2**30


def cfg_with(*overrides):
    cfg = load_config(["+recipe=quickstart", *overrides])
    return cfg


def test_sync_plan_broadcasts_from_rank0_unless_colocated_on_gpus():
    cfg = cfg_with("rollout.num_workers=3", "cluster.placement=split")
    assert sync_transport(cfg) == "broadcast" and sync_plan(cfg) == {0: [(0, 0), (1, 0), (2, 0)]}
    cfg = cfg_with("rollout.num_workers=2")  # colocate on the CPU: gloo broadcast
    assert sync_plan(cfg) == {0: [(0, 0), (1, 0)]}
    cfg.trainer.device = "cuda"  # colocate on GPUs: each rank feeds the actor on its GPU by IPC
    assert sync_transport(cfg) == "ipc" and sync_plan(cfg) == {0: [(0, 0)], 1: [(1, 0)]}
    cfg.trainer.world_size, cfg.rollout.num_workers = 4, 2
    assert sync_plan(cfg) == {0: [(0, 0)], 1: [(1, 0)]}


def test_every_shard_of_every_replica_is_a_receiver():
    """Tensor parallel: rank 0 broadcasts to each shard of each replica (one group, 1 + R x T ranks)."""
    cfg = cfg_with("rollout.num_workers=2", "cluster.placement=split")
    cfg.rollout.tensor_parallel_size = 2
    assert sync_plan(cfg) == {0: [(0, 0), (0, 1), (1, 0), (1, 1)]}
    cfg.trainer.world_size, cfg.cluster.placement, cfg.trainer.device = 4, "colocate", "cuda"
    assert sync_plan(cfg) == {0: [(0, 0)], 1: [(0, 1)], 2: [(1, 0)], 3: [(1, 1)]}  # each shard: its GPU's rank


def test_colocate_needs_a_trainer_rank_per_rollout_actor():
    with pytest.raises(ConfigError, match="rollout.num_workers=3 must be <= trainer.world_size=2"):
        cfg_with("rollout.num_workers=3")
    with pytest.raises(
        ConfigError, match="num_workers=2 x rollout.tensor_parallel_size=2 must be <= trainer.world_size=2"
    ):
        cfg_with("rollout.backend=vllm", "rollout.tensor_parallel_size=2", "rollout.num_workers=2")


def test_colocated_vllm_must_fit_beside_the_trainer():
    cfg = cfg_with("rollout.gpu_memory_utilization=0.5")
    cfg.rollout.backend = "vllm"
    check_colocated_memory(cfg, [{"total": 80 * GIB, "free": 70 * GIB, "resident": 30 * GIB}])
    with pytest.raises(ConfigError) as e:
        check_colocated_memory(
            cfg,
            [
                {"total": 80 * GIB, "free": 70 * GIB, "resident": 30 * GIB},
                {"total": 80 * GIB, "free": 30 * GIB, "resident": 45 * GIB},
            ],
        )
    msg = str(e.value)
    assert "rollout.gpu_memory_utilization=0.5" in msg and "trainer rank 1" in msg
    assert "rollout.gpu_memory_utilization<=0.42" in msg and "trainer.param_offload=true" in msg


@pytest.mark.parametrize("estimator,norm", [("grpo", True), ("grpo", False), ("rloo", False)])
def test_each_reward_reaches_its_own_rows_through_groups_advantages_and_shards(estimator, norm):
    """rollout.n = 3, responses of unequal lengths, world size 2 with a token budget: the plan
    gives the ranks different rows and micro-batches; every row's advantage is the one its own
    group's rewards give, computed here from scratch."""
    import torch

    from rlpost.controller.step import advantages, group_ids, step_plan
    from rlpost.data.batch import Batch
    from rlpost.data.microbatch import shard_batch
    from rlpost.data.padding import left_pad, right_pad

    n, prompts = 3, 4
    cfg = cfg_with(
        f"rollout.n={n}",
        f"data.train_batch_size={prompts}",
        "trainer.world_size=2",
        "trainer.max_tokens_per_microbatch=12",
        "trainer.micro_batch_size=4",
        f"algo.name={estimator}",
        f"algo.norm_adv_by_std={str(norm).lower()}",
    )
    groups = group_ids(prompts, n)
    assert groups.tolist() == [0, 0, 0, 1, 1, 1, 2, 2, 2, 3, 3, 3]
    response_lengths = [1, 6, 2, 5, 3, 1, 4, 6, 2, 1, 1, 5]
    prompt_ids, prompt_mask = left_pad([[5] * (2 + i % 3) for i in range(n * prompts)], 0)
    response_ids, response_mask = right_pad([[7] * k for k in response_lengths], 0)
    batch = Batch(
        {
            "prompt_ids": prompt_ids,
            "prompt_mask": prompt_mask,
            "response_ids": response_ids,
            "response_mask": response_mask,
            "group_ids": groups,
        }
    )
    rewards = torch.tensor([1.0, 0.0, 0.5, 0.0, 0.0, 1.0, 2.0, 1.0, 0.0, 1.0, 1.0, 1.0])
    batch["rewards"] = rewards
    batch["advantages"] = advantages(batch, cfg)

    expected = []
    for i in range(n * prompts):
        mine = rewards[(i // n) * n : (i // n + 1) * n].double()  # the rows of prompt i // n
        others = torch.cat([mine[: i % n], mine[i % n + 1 :]])
        if estimator == "rloo":
            expected.append(rewards[i].item() - others.mean().item())
        else:
            a = rewards[i].item() - mine.mean().item()
            expected.append(a / (mine.std().item() + 1e-6) if norm else a)

    lengths, plan = step_plan(batch, cfg)
    assert lengths == [p + r for p, r in zip(prompt_mask.sum(-1).tolist(), response_lengths)]
    shards = shard_batch(batch, plan)
    assert sorted(sum((s["row_index"].tolist() for s in shards), [])) == list(range(n * prompts))
    assert len({tuple(s["row_index"].tolist()) for s in shards}) == 2  # the ranks got different rows
    assert sum(len(m) > 1 for rank in plan for m in rank[0]) > 0  # and more than one row per micro-batch
    for shard in shards:
        for row, adv, resp in zip(shard["row_index"].tolist(), shard["advantages"].tolist(), shard["response_mask"]):
            assert adv == pytest.approx(expected[row], abs=1e-5), f"row {row}"
            assert int(resp.sum()) == response_lengths[row]  # the row's own tokens travel with it


def test_an_actor_and_a_critic_on_one_device_must_fit_together():
    from rlpost.controller.weights import merge_memory

    actor = {"total": 80 * GIB, "free": 60 * GIB, "resident": 20 * GIB}
    critic = {"total": 80 * GIB, "free": 50 * GIB, "resident": 10 * GIB}
    assert merge_memory((actor, critic)) == {"total": 80 * GIB, "free": 50 * GIB, "resident": 30 * GIB}
    assert merge_memory(({}, {})) == {}  # CPU: nothing to report
    cfg = cfg_with("rollout.backend=vllm", "rollout.gpu_memory_utilization=0.65")
    check_colocated_memory(cfg, [actor])  # the actor alone leaves room for vLLM
    with pytest.raises(ConfigError, match="trainer rank 0"):
        check_colocated_memory(cfg, [merge_memory((actor, critic))])  # with its critic it does not


def test_bundles_give_a_tensor_parallel_engine_its_gpus_on_one_bundle():
    from rlpost.controller.placement import bundle_layout

    cfg = cfg_with("rollout.num_workers=2", "cluster.placement=split")
    cfg.trainer.device, cfg.rollout.tensor_parallel_size = "cuda", 2
    bundles, trainers, rollouts, shares = bundle_layout(cfg)
    assert bundles == [{"CPU": 1, "GPU": 1}] * 2 + [{"CPU": 1, "GPU": 2}] * 2  # a bundle lies on one node
    assert (trainers, rollouts, shares["rollout"]) == ([0, 1], [2, 3], 1.0)
    cfg.cluster.placement, cfg.rollout.tensor_parallel_size = "colocate", 1
    bundles, trainers, rollouts, shares = bundle_layout(cfg, roles=("actor", "rollout", "critic"))
    assert bundles == [{"CPU": 1, "GPU": 1}] * 2 and rollouts == [0, 1] and shares["rollout"] == 1 / 3


def test_a_colocated_tensor_parallel_engine_runs_on_its_trainer_ranks_gpus():
    from rlpost.controller.placement import engine_devices

    cfg = cfg_with("rollout.num_workers=2")
    cfg.trainer.world_size, cfg.trainer.device, cfg.rollout.tensor_parallel_size = 4, "cuda", 2
    assert engine_devices(cfg, ["3", "1", "0", "2"], ["a"] * 4) == ["3,1", "0,2"]  # as Ray numbers the GPUs
    spans = r"rollout actor 1 would span trainer ranks 2..3 on nodes \['a', 'b'\]; an engine's shards must share "
    with pytest.raises(ConfigError, match=spans + "a node: use a tensor_parallel_size that divides the GPUs per node$"):
        engine_devices(cfg, ["0", "1", "0", "0"], ["a", "a", "a", "b"])
    cfg.rollout.tensor_parallel_size = 1  # one GPU each: the one Ray gave the actor
    assert engine_devices(cfg, ["0"] * 4, ["a"] * 4) == [None, None]


def test_every_roles_share_of_its_bundle_on_the_cpu_and_a_colocated_engines_first_gpu():
    """Each role's share, for every role, colocated and split, with a critic, a reward model or
    both on the trainer bundles; CPU bundles; a colocated TP-2 engine on the bundle of its first
    shard's rank."""
    from rlpost.controller.placement import bundle_layout

    roles = ("trainer", "critic", "reward_model", "rollout")
    cfg = cfg_with("rollout.num_workers=2")
    bundles, trainers, rollouts, shares = bundle_layout(cfg)
    assert (bundles, trainers, rollouts) == ([{"CPU": 1}] * 2, [0, 1], [0, 1])
    assert shares == dict.fromkeys(roles, 1 / 2)  # the actor and the rollout take turns
    _, _, _, shares = bundle_layout(cfg, roles=("actor", "rollout", "reward_model"))
    assert shares == dict.fromkeys(roles, 1 / 3)
    cfg.cluster.placement = "split"
    bundles, trainers, rollouts, shares = bundle_layout(cfg, roles=("actor", "rollout", "critic", "reward_model"))
    assert (bundles, trainers, rollouts) == ([{"CPU": 1}] * 4, [0, 1], [2, 3])
    assert shares == dict.fromkeys(roles[:3], 1 / 3) | {"rollout": 1.0}
    _, _, _, shares = bundle_layout(cfg)
    assert shares == dict.fromkeys(roles[:3], 1.0) | {"rollout": 1.0}
    cfg.cluster.placement, cfg.trainer.world_size, cfg.trainer.device = "colocate", 4, "cuda"
    cfg.rollout.tensor_parallel_size = 2
    bundles, _, rollouts, _ = bundle_layout(cfg)
    assert bundles == [{"CPU": 1, "GPU": 1}] * 4 and rollouts == [0, 2]


def test_a_split_runs_trainer_gpus_get_expandable_segments_and_the_users_setting_is_kept(monkeypatch):
    """On a split run's trainer GPUs every role but the rollout gets PyTorch's expandable segments
    (the caching allocator's reserve, benchmarks/multi_gpu/alloc_h200x4.json), added to the user's
    PYTORCH_CUDA_ALLOC_CONF; a user's own expandable_segments, a colocated run, the CPU: left alone."""
    from rlpost.controller.placement import Placement, allocator_conf

    cfg = cfg_with("rollout.num_workers=1")
    cfg.cluster.placement, cfg.trainer.device = "split", "cuda"
    for role in ("trainer", "critic", "reward_model"):
        assert allocator_conf(cfg, role, None) == "expandable_segments:True"
        assert allocator_conf(cfg, role, "") == "expandable_segments:True"
    assert allocator_conf(cfg, "rollout", None) is None
    assert allocator_conf(cfg, "trainer", "max_split_size_mb:512") == "max_split_size_mb:512,expandable_segments:True"
    assert allocator_conf(cfg, "trainer", "expandable_segments:False") is None
    monkeypatch.delenv("PYTORCH_CUDA_ALLOC_CONF", raising=False)
    assert Placement.env(cfg, "trainer")["PYTORCH_CUDA_ALLOC_CONF"] == "expandable_segments:True"
    assert "PYTORCH_CUDA_ALLOC_CONF" not in Placement.env(cfg, "rollout")
    monkeypatch.setenv("PYTORCH_CUDA_ALLOC_CONF", "garbage_collection_threshold:0.8")
    conf = Placement.env(cfg, "critic")["PYTORCH_CUDA_ALLOC_CONF"]
    assert conf == "garbage_collection_threshold:0.8,expandable_segments:True"
    cfg.cluster.placement = "colocate"
    assert allocator_conf(cfg, "trainer", None) is None
    cfg.cluster.placement, cfg.trainer.device = "split", "cpu"
    assert allocator_conf(cfg, "trainer", None) is None
