"""Resume equals no resume: a run killed part-way and resumed from its last checkpoint ends bit
for bit where an uninterrupted run of the same config ends: the model, Adam's states (on the
device, or layerwise on the host), the scheduler, each step's prompts (the data order, across
epochs) and each step's sampled completions. In colocate placement and in split placement with
one-step-off-policy (where the batch generated during the checkpointed step, by the weights
before it, is kept in the checkpoint)."""

import json

import pytest
import torch

from rlpost.config import load_config
from rlpost.controller import loop
from rlpost.controller.run import train
from tests.helpers import PROBLEMS, Crash, assert_equal, trainer_state, write_rows

pytestmark = [pytest.mark.integration, pytest.mark.slow]

STEPS, CRASH_AT = 6, 4  # checkpoints at steps 2, 4, 6; the crash loses step 3


def overrides(base_overrides, tmp_path, run_dir, placement, offload):
    # 10 rows, 4 prompts a step: an epoch is 2 steps (the incomplete batch is dropped), 6 steps cross 2 boundaries
    train_file = write_rows(tmp_path / "train.jsonl", PROBLEMS)
    val_file = write_rows(tmp_path / "val.jsonl", PROBLEMS[:2])
    return base_overrides(run_dir) + [
        "data.task=",
        f"data.train_files=[{train_file}]",
        f"data.val_files=[{val_file}]",
        "data.train_batch_size=4",
        "rollout.n=2",
        "trainer.world_size=2",  # sharded checkpoints
        f"trainer.total_steps={STEPS}",
        "trainer.save_every=2",
        "trainer.keep_checkpoints=5",
        "trainer.val_every=0",
        f"cluster.placement={placement}",
        f"trainer.optim.offload={offload}",
        "logger.samples_per_step=100",
        "trainer.optim.lr=3e-3",
        "algo.entropy_coef=0.01",
    ]  # a gradient although the barely warmed-up model earns no reward


ROWS = 4 * 2  # samples a step (all of them are logged)


def samples_by_step(run_dir):
    """{step: [(prompt, response)]} from samples.jsonl."""
    steps: dict[int, list] = {}
    for line in (run_dir / "samples.jsonl").read_text().splitlines():
        row = json.loads(line)
        steps.setdefault(row["step"], []).append((row["prompt"], row["response"]))
    assert all(len(rows) == ROWS for rows in steps.values())
    return steps


@pytest.mark.parametrize(
    "placement, offload",
    [
        # CI runs the split one (one-step-off, layerwise host states); colocate resume is also
        # checked bitwise in CI by test_reliability's killed actors and test_signals' SIGTERM
        pytest.param("colocate", "none", marks=pytest.mark.demo),
        ("split", "layerwise"),
    ],
)
def test_a_killed_and_resumed_run_ends_bitwise_where_an_uninterrupted_one_ends(
    ray_session, base_overrides, tmp_path, monkeypatch, placement, offload
):
    straight, killed = tmp_path / "straight", tmp_path / "killed"
    train(load_config(overrides(base_overrides, tmp_path, straight, placement, offload)))

    real_step = loop.Controller.train_step

    def crash_at(self):
        if self.step + 1 == CRASH_AT:  # the process dies during this step, after step 3 was logged
            raise Crash(f"killed during step {CRASH_AT}")
        return real_step(self)

    monkeypatch.setattr(loop.Controller, "train_step", crash_at)
    with pytest.raises(Crash):
        train(load_config(overrides(base_overrides, tmp_path, killed, placement, offload)))
    monkeypatch.setattr(loop.Controller, "train_step", real_step)
    assert sorted(p.name for p in (killed / "checkpoints").iterdir()) == ["step_2"]
    train(load_config(overrides(base_overrides, tmp_path, killed, placement, offload) + ["trainer.resume=auto"]))

    a, b = samples_by_step(straight), samples_by_step(killed)
    assert sorted(a) == sorted(b) == list(range(1, STEPS + 1))
    for step in a:  # the data order (across epoch boundaries) and every sampled completion
        assert a[step] == b[step], f"step {step} differs"
    prompts = [[p for p, _ in a[s]] for s in sorted(a)]
    assert len({tuple(p) for p in prompts}) == STEPS  # each step saw other prompts: the order matters
    assert prompts[0] + prompts[1] != prompts[2] + prompts[3]  # and each epoch is another shuffle
    # step 3 ran twice; the logs hold it once: the resumed run dropped the rows past its checkpoint
    assert len(b) == STEPS and sum(1 for line in (killed / "samples.jsonl").open()) == STEPS * ROWS
    logged = [[json.loads(line)["step"] for line in (run / "metrics.jsonl").open()] for run in (straight, killed)]
    assert logged[0] == logged[1] and logged[1][-STEPS:] == list(range(1, STEPS + 1))
    final_a, final_b = (trainer_state(run / "checkpoints" / f"step_{STEPS}") for run in (straight, killed))
    assert_equal(final_a, final_b)
    start = trainer_state(straight / "checkpoints" / "step_2")
    moved = [k for k, v in final_a["dcp"]["model"].items() if not torch.equal(v, start["dcp"]["model"][k])]
    assert moved, "training did not change the weights: the comparison would prove nothing"
    controller_a, controller_b = (
        torch.load(run / "checkpoints" / f"step_{STEPS}" / "controller.pt", weights_only=False)
        for run in (straight, killed)
    )
    assert controller_a["loader"] == controller_b["loader"] and controller_a["version"] == controller_b["version"]
