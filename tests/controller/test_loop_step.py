"""The controller's step without Ray (`Controller.train_step` on fake worker groups): what each group
is asked, in which order, with which rows, and what the step makes of their answers. The Ray runs
(tests/integration) cover the same step end to end; these run in the fast set, where the mutation
run counts them (benchmarks/mutation/mutation_loop_rollouts.json: loop.py 0.02 without them)."""

from types import SimpleNamespace

import pytest
import torch

from rlpost.algos.algorithms import ALGORITHMS
from rlpost.algos.filters import BATCH_FILTERS
from rlpost.algos.kl_control import KLController
from rlpost.config import load_config
from rlpost.controller.adapter_probe import AdapterProbe
from rlpost.controller.loop import Controller
from rlpost.controller.step import group_ids
from rlpost.controller.stream import Scored
from rlpost.data.batch import Batch
from rlpost.metrics.trackers import SampleLog
from tests.helpers import ragged_generation

PROMPTS, N = 4, 2
SCORES = torch.tensor([1.0, 0.0, 0.0, 0.0, 1.0, 1.0, 0.5, 0.0])


class Group:
    """A worker group that records each call (method, rows of each shard, arguments) in `calls`,
    shared by every group of one controller, and answers per-row results as trainer ranks do."""

    def __init__(self, name: str, calls: list):
        self.name, self.calls = name, calls

    def call(self, method: str, *args):
        self.calls.append((self.name, method, None, args))
        return [{}]

    def call_sharded(self, method: str, shards: list[Batch], *args):
        self.calls.append((self.name, method, [s["row_index"].tolist() for s in shards], args))
        if method == "compute_logprobs":  # the old and the reference log-probs
            return [
                rows_of(s, old_logprobs=-0.5 * s["response_mask"], ref_logprobs=-0.75 * s["response_mask"])
                for s in shards
            ]
        if method == "compute_values":
            return [rows_of(s, values=0.25 * s["response_mask"]) for s in shards]
        if method == "update" and self.name == "critic":
            return [{"critic/loss": 1.5}]
        self.updated = [
            Batch({k: s[k].clone() for k in s.keys()}) for s in shards
        ]  # the policy's update: its rows, as they were sent
        return [({"actor/loss": 0.5}, rows_of(s, old_logprobs=-0.25 * s["response_mask"])) for s in shards]


def rows_of(shard: Batch, **values) -> Batch:
    return Batch({"row_index": shard["row_index"], **{k: v.float() for k, v in values.items()}})


class Batches:
    """`Rollouts` as the step uses it: one scored batch a call, the syncs it is told of."""

    def __init__(self, calls: list, version: int = 0):
        self.calls, self.version, self.overlap = calls, version, False

    def next_scored(self, step: int, keep, version: int) -> Scored:
        self.calls.append(("rollouts", "next_scored", None, (step, version)))
        batch, _ = ragged_generation(step, rows=PROMPTS * N)
        batch["rollout_logprobs"] = -0.5 * batch["response_mask"].float()
        batch["weight_version"] = torch.full((PROMPTS * N,), self.version)
        batch["group_ids"] = group_ids(PROMPTS, N)
        batch["rewards"] = SCORES.clone()
        self.tokens = batch["response_mask"].sum(-1).float().mean().item()  # a sample's, on average
        rows = [SimpleNamespace(prompt=f"p{i}", ground_truth=str(i)) for i in range(PROMPTS)]
        return Scored(rows, batch, SCORES.clone(), {}, ["r"] * (PROMPTS * N), {"filter/kept": 1.0})

    def synced(self, step: int) -> None:
        self.calls.append(("rollouts", "synced", None, (step,)))


def controller(tmp_path, *overrides, recipe: str = "quickstart") -> Controller:
    cfg = load_config([f"+recipe={recipe}", f"data.train_batch_size={PROMPTS}", f"rollout.n={N}", *overrides])
    c = Controller.__new__(Controller)  # no Ray, no models: the groups are fakes
    calls: list = []
    c.cfg, c.log, c.restarts, c.dropped_prompts, c.step, c.version, c.base = cfg, print, 2, 3, 0, 0, None
    c.algorithm = ALGORITHMS.get(cfg.algo.name)
    c.keep_groups = BATCH_FILTERS[c.algorithm.batch_filter]
    c.kl, c.probe = KLController(cfg.algo.kl_coef, cfg.algo.kl_target, cfg.algo.kl_horizon), AdapterProbe(False)
    c.samples, c.tokenizer = SampleLog(tmp_path, 0), SimpleNamespace(eos_token_id=2)
    c.trainers, c.rollouts = Group("trainer", calls), Group("rollout", calls)
    c.critics = Group("critic", calls) if "critic" in c.algorithm.roles else None
    c.batches = Batches(calls)
    c.weights = SimpleNamespace(
        sync=lambda version: calls.append(("weights", "sync", None, (version,))) or {"weight_sync/verified": 1.0}
    )
    c.workers = SimpleNamespace(trained=lambda: [g for g in (c.trainers, c.critics) if g is not None])
    c.calls = calls
    return c


def grpo_reference(scores: torch.Tensor, n: int) -> torch.Tensor:
    groups = scores.double().view(-1, n)
    return ((groups - groups.mean(1, keepdim=True)) / (groups.std(1, keepdim=True) + 1e-6)).flatten()


def test_a_colocated_grpo_step_trains_the_scored_batch_with_group_advantages_then_syncs(tmp_path):
    c = controller(tmp_path, "trainer.world_size=2")
    metrics = c.train_step()
    assert [(who, method) for who, method, _, _ in c.calls] == [
        ("rollouts", "next_scored"),
        ("rollout", "sleep"),  # the scored batch hands the devices to the trainer
        ("trainer", "update"),
        ("trainer", "release_memory"),  # and the update hands them back, before the sync
        ("weights", "sync"),
        ("rollouts", "synced"),
    ]
    assert c.calls[0][3] == (0, 0)  # the step's number and the trainer's version
    _, _, rows, args = c.calls[2]
    assert sorted(rows[0] + rows[1]) == list(range(PROMPTS * N)) and all(rows)  # every row once, over 2 ranks
    assert args == (False, 1)  # no adapter to probe; the update's step number
    updated = Batch.cat(c.trainers.updated)
    advantages = updated["advantages"][torch.argsort(updated["row_index"])]
    assert torch.allclose(advantages.double(), grpo_reference(SCORES, N), atol=1e-5)
    assert c.version == 1 and c.calls[4][3] == (1,) and c.calls[5][3] == (1,)  # the new version, synced
    assert metrics["reward/mean"] == pytest.approx(SCORES.mean().item())
    assert metrics["reward/shaped_mean"] == pytest.approx(SCORES.mean().item())
    assert metrics["actor/loss"] == 0.5 and metrics["weight_sync/verified"] == 1.0 and metrics["filter/kept"] == 1.0
    assert (
        metrics["rollout/staleness"] == 0.0
        and metrics["run/restarts"] == 2.0
        and metrics["data/dropped_prompts"] == 3.0
    )
    assert "timing_s/update" in metrics and "timing_s/logprob" not in metrics  # old log-probs from the update's forward


def test_the_update_forwards_log_probs_replace_the_old_ones_row_by_row(tmp_path):
    """The update returned -0.25 a token against the rollout's -0.5: the step's agreement metrics
    read them from the batch, so they come back to the rows they belong to."""
    metrics = controller(tmp_path, "trainer.world_size=2").train_step()
    assert metrics["rollout/logprob_diff_mean"] == pytest.approx(0.25)
    assert metrics["rollout/logprob_diff_max"] == pytest.approx(0.25)


PPO = ["algo.ppo_mini_batch_size=2", "cluster.placement=split"]


@pytest.mark.parametrize("warmup", [0, 1])
def test_a_ppo_step_takes_old_log_probs_then_values_then_the_critics_update_before_the_policys(tmp_path, warmup):
    c = controller(tmp_path, *PPO, f"critic.warmup_steps={warmup}", recipe="ppo")
    metrics = c.train_step()
    policy = [] if warmup else [("trainer", "update")]  # in its warm-up only the critic trains
    assert [(who, method) for who, method, _, _ in c.calls] == [
        ("rollouts", "next_scored"),  # split: nobody sleeps
        ("trainer", "compute_logprobs"),  # two mini-batches: the old log-probs from a pass of their own
        ("critic", "compute_values"),
        ("critic", "update"),
        *policy,
        ("weights", "sync"),
        ("rollouts", "synced"),
    ]
    assert c.version == 1 - warmup and metrics["critic/loss"] == 1.5
    assert ("actor/loss" in metrics) == (not warmup) and "timing_s/logprob" in metrics
    assert metrics["kl/coef"] == pytest.approx(0.001)  # the KL in the reward: its coefficient and value
    assert metrics["kl/reward_kl"] == pytest.approx(0.25 * c.batches.tokens)  # k1: old - ref = 0.25 a token
    if not warmup:
        updated = Batch.cat(c.trainers.updated)
        assert {"advantages", "returns", "values", "old_logprobs", "ref_logprobs"} <= set(updated.keys())


def test_a_batch_older_than_the_staleness_bound_is_refused(tmp_path):
    c = controller(tmp_path)
    c.version = 1  # the trainer is one version ahead of the batch's generator, synchronous
    with pytest.raises(RuntimeError, match="generated by weight version 0 would train version 1"):
        c.train_step()


def test_a_saved_step_resumes_with_its_version_kl_coefficient_ledger_and_random_state(tmp_path):
    import random

    c = controller(tmp_path, "trainer.keep_checkpoints=2")
    c.run_dir, c.step, c.version, c.kl.coef = tmp_path, 3, 3, 0.125
    c.batches.state_dict = lambda: {"loader": {"drawn": 24}}
    random.seed(7)
    torch.manual_seed(7)
    folder = c.save()
    expected = (random.random(), torch.rand(1))  # what the saved run draws next
    assert folder == tmp_path / "checkpoints" / "step_3" and (folder / "controller.pt").is_file()
    assert [(who, m) for who, m, _, _ in c.calls] == [("trainer", "save_checkpoint")]

    resumed = controller(tmp_path, "trainer.resume=auto")
    resumed.run_dir, loaded = tmp_path, []
    resumed.batches.load_state_dict = loaded.append
    random.seed(0)
    torch.manual_seed(0)
    resumed._resume()
    assert (resumed.step, resumed.version, resumed.kl.coef) == (3, 3, 0.125)
    assert loaded[0]["loader"] == {"drawn": 24}
    assert [m for who, m, _, _ in resumed.calls] == ["load_checkpoint"]
    assert random.random() == expected[0] and torch.equal(torch.rand(1), expected[1])


@pytest.mark.parametrize("greedy", [True, False])
def test_validation_asks_one_sample_a_prompt_with_the_runs_seed_and_rearms_the_adapter_check(tmp_path, greedy):
    c = controller(tmp_path, f"rollout.val_greedy={greedy}", "run.seed=5", "model.lora.rank=4", "model.lora.alpha=8")
    c.probe, asked = AdapterProbe(True), []
    c.probe.passed = True  # checked at an earlier step
    c.val_rows = ["row"]
    c.batches.validate = lambda rows, params: asked.append((rows, params)) or {"val/accuracy": 0.5}
    assert c.validate() == {"val/accuracy": 0.5}
    ((rows, params),) = asked
    assert rows == ["row"] and (params.n, params.greedy, params.seed) == (1, greedy, 5)
    assert params.max_tokens == c.cfg.rollout.max_response_length
    assert not c.probe.passed  # the next step's batch checks the rollouts' adapter again
