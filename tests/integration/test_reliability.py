"""Long runs that survive: actors killed mid-run are replaced and the run ends bit for bit where an
uninterrupted one ends; a reward function that hangs is timed out and the run goes on; one that
fails on most samples, step after step, stops the run with its traceback."""

import json
import os
import threading
import time

import pytest

from rlpost.config import load_config
from rlpost.controller.run import WorkersDied, train
from rlpost.controller.scoring import RewardFailure
from tests.helpers import assert_equal, trainer_state

pytestmark = [pytest.mark.integration, pytest.mark.timeout(900)]


def rows(run_dir):
    out = []
    path = run_dir / "metrics.jsonl"
    for line in path.read_text().splitlines() if path.is_file() else []:
        try:
            out.append(json.loads(line))
        except json.JSONDecodeError:  # a line being written
            pass
    return out


def kill_when(run_dir, plan, done: list):
    """For each (restarts, step, actor name): once a row of that attempt reached that step, kill
    the actor (as a node failure would)."""
    import ray

    for restarts, step, name in plan:
        deadline = time.monotonic() + 600
        while not any(r["step"] >= step and r.get("run/restarts") == restarts for r in rows(run_dir)):
            if time.monotonic() > deadline:
                return
            time.sleep(0.1)
        ray.kill(ray.get_actor(name))
        done.append(name)


@pytest.mark.slow
def test_killed_actors_are_replaced_and_the_run_ends_where_an_uninterrupted_one_ends(
    ray_session, base_overrides, tmp_path
):
    def cfg(run_dir, *extra):
        return load_config(
            base_overrides(run_dir)
            + [
                "trainer.world_size=2",  # a killed trainer rank leaves its peer in the collective
                "trainer.total_steps=6",
                "trainer.save_every=2",
                "trainer.keep_checkpoints=5",
                "trainer.val_every=0",
                "trainer.optim.lr=3e-3",
                "algo.entropy_coef=0.01",  # a gradient although the barely warmed-up model earns no reward
                *extra,
            ]
        )

    straight, killed = tmp_path / "straight", tmp_path / "killed"
    train(cfg(straight))
    pid, done = os.getpid(), []
    plan = [(0, 3, f"rollout-0-{pid}"), (1, 5, f"trainer-1-{pid}")]
    killer = threading.Thread(target=kill_when, args=(killed, plan, done), daemon=True)
    killer.start()
    train(cfg(killed, "trainer.max_restarts=2"))
    killer.join(timeout=10)
    assert done == [name for *_, name in plan]
    final = rows(killed)
    assert [r["step"] for r in final if r["step"] > 0] == [1, 2, 3, 4, 5, 6]  # each step once
    assert final[-1]["run/restarts"] == 2
    assert_equal(trainer_state(straight / "checkpoints" / "step_6"), trainer_state(killed / "checkpoints" / "step_6"))


def test_a_death_past_max_restarts_stops_the_run(ray_session, base_overrides, tmp_path):

    run_dir = tmp_path / "run"
    done = []
    killer = threading.Thread(target=kill_when, args=(run_dir, [(0, 1, f"rollout-0-{os.getpid()}")], done), daemon=True)
    killer.start()
    with pytest.raises(WorkersDied, match=r"^rollout 0 died \(\w+: .*; the run stopped after step \d+\. No checkpoint "
                       r"was written, so nothing to go on from"):  # fmt: skip
        train(load_config(base_overrides(run_dir) + ["trainer.total_steps=50", "trainer.val_every=0"]))
    assert done


HANGS = """
import time

calls = 0

def hangs(sample):
    global calls
    calls += 1
    if calls % 4 == 0:  # every fourth sample a worker scores hangs for good (never three in a row)
        time.sleep(3600)
    return 1.0
"""

FAILS = """
def fails(sample):
    raise ValueError(f"cannot parse {sample.response!r}")
"""


def test_a_hanging_reward_times_out_and_the_run_goes_on(ray_session, base_overrides, tmp_path):
    (tmp_path / "r.py").write_text(HANGS)
    run_dir = tmp_path / "run"
    extra = [f"reward.fn={tmp_path / 'r.py'}:hangs", "reward.timeout_s=0.2", "reward.max_error_fraction=1.0"]
    extra.append("logger.samples_per_step=32")  # every sample of a step (8 prompts x 4)
    train(load_config(base_overrides(run_dir) + ["trainer.total_steps=2", "trainer.val_every=0", *extra]))
    steps = [r for r in rows(run_dir) if r["step"] > 0]
    assert len(steps) == 2
    samples = [json.loads(line) for line in (run_dir / "samples.jsonl").read_text().splitlines()]
    for r in steps:  # a sample that hung scores reward.error_score (0), one that did not scores 1
        rewards = [x["reward"] for x in samples if x["step"] == r["step"]]
        assert len(rewards) == 32 and set(rewards) == {0.0, 1.0}
        assert r["reward/timeouts"] == r["reward/errors"] == rewards.count(0.0)


def test_a_reward_failing_on_every_sample_stops_the_run_with_its_traceback(ray_session, base_overrides, tmp_path):
    (tmp_path / "f.py").write_text(FAILS)
    run_dir = tmp_path / "run"
    extra = [f"reward.fn={tmp_path / 'f.py'}:fails", "reward.max_error_steps=2", "trainer.val_every=0"]
    with pytest.raises(RewardFailure) as info:
        train(load_config(base_overrides(run_dir) + ["trainer.total_steps=10", *extra]))
    message = str(info.value)
    assert "32 of 32 samples failed to score" in message and "2 batches in a row" in message
    assert "Traceback" in message and "ValueError: cannot parse" in message and "f.py" in message
    assert len([r for r in rows(run_dir) if r["step"] > 0]) == 1  # step 2 failed: the run stopped there


@pytest.mark.slow
# CI runs layerwise (rlpost's own per-rank host states, resharded by rlpost); `none` reshards
# Adam's states through torch's DCP alone
@pytest.mark.parametrize("offload", [pytest.param("none", marks=pytest.mark.demo), "layerwise"])
def test_a_run_saved_by_two_ranks_resumes_on_one(ray_session, base_overrides, tmp_path, offload):
    """DCP reshards the model and Adam's states (the layerwise optimizer's host states are put
    together from both ranks' files): the run resumed on 1 rank ends where the run on 2 ranks ends,
    up to the order of the gradient sums. Adam states lost or misplaced would move the weights of
    step 3 by about the learning rate, 300x the tolerance."""
    import torch

    def cfg(run_dir, *extra):
        steps = ["trainer.val_every=0", "trainer.optim.lr=3e-3", "algo.entropy_coef=0.01", "trainer.keep_checkpoints=5"]
        steps.append("trainer.world_size=2")  # saved by two ranks (the last run resumes on one)
        return load_config(base_overrides(run_dir) + steps + [f"trainer.optim.offload={offload}", *extra])

    straight, moved = tmp_path / "straight", tmp_path / "moved"
    train(cfg(straight, "trainer.total_steps=3", "trainer.save_every=1"))
    train(cfg(moved, "trainer.total_steps=2", "trainer.save_every=2"))
    train(cfg(moved, "trainer.total_steps=3", "trainer.save_every=1", "trainer.world_size=1", "trainer.resume=auto"))
    a, b = (trainer_state(run / "checkpoints" / "step_3")["dcp"] for run in (straight, moved))
    start = trainer_state(straight / "checkpoints" / "step_2")["dcp"]
    for name, tensor in a["model"].items():
        assert torch.allclose(tensor, b["model"][name], atol=1e-5, rtol=1e-4), name
    assert any(not torch.equal(t, start["model"][n]) for n, t in a["model"].items())
    if offload == "none":  # Adam's states in DCP, resharded by torch
        assert a["optimizer"]["state"]
        for name, state in a["optimizer"]["state"].items():
            assert torch.allclose(state["exp_avg"], b["optimizer"]["state"][name]["exp_avg"], atol=1e-6, rtol=1e-3)
        return
    # layerwise: each rank's host states ([exp_avg | exp_avg_sq] a unit, its rows of each parameter),
    # put together from both saved ranks for the one resuming: a unit's states over both ranks of
    # the straight run hold what the one rank of the moved run holds (lost or zeroed states would
    # be step 3's alone: their norms off by far more than the summation order's round-off)
    two = [trainer_state(straight / "checkpoints" / "step_3")[f"trainer_rank{r}.pt"]["optimizer"] for r in (0, 1)]
    one = trainer_state(moved / "checkpoints" / "step_3")["trainer_rank0.pt"]["optimizer"]
    assert one["steps"] == two[0]["steps"] == 3 and len(one["host"]) == len(two[0]["host"]) > 1
    for i, host in enumerate(one["host"]):
        assert host.numel() == two[0]["host"][i].numel() + two[1]["host"][i].numel() and host.abs().sum() > 0
        both = torch.cat([two[0]["host"][i], two[1]["host"][i]]).double().norm()
        assert torch.allclose(host.double().norm(), both, rtol=1e-3), i


# out of CI for time: tests/test_bad_inputs.py's resume tests pass over a damaged newest checkpoint
@pytest.mark.demo
def test_a_damaged_newest_checkpoint_falls_back_to_the_one_before(ray_session, base_overrides, tmp_path):
    run_dir = tmp_path / "run"
    base = base_overrides(run_dir) + ["trainer.val_every=0", "trainer.save_every=1", "trainer.keep_checkpoints=3"]
    train(load_config(base + ["trainer.total_steps=2"]))
    shard = next((run_dir / "checkpoints" / "step_2" / "trainer").glob("*.distcp"))
    shard.write_bytes(shard.read_bytes()[:-10])  # cut short, as by a full disk or a preempted copy
    logged = []
    train(load_config(base + ["trainer.total_steps=3", "trainer.resume=auto"]), log=logged.append)
    assert any("step_2 is damaged" in line and f"trainer/{shard.name}" in line for line in logged)
    assert any(line.startswith(f"resumed from {run_dir / 'checkpoints' / 'step_1'}") for line in logged)
    assert [r["step"] for r in rows(run_dir) if r["step"] > 0] == [1, 2, 3]


def test_a_full_disk_while_checkpointing_is_a_clear_error(ray_session, base_overrides, tmp_path, monkeypatch):
    import errno

    from rlpost.controller import checkpoint

    run_dir = tmp_path / "run"
    base = base_overrides(run_dir) + ["trainer.val_every=0", "trainer.save_every=1"]
    real_save = checkpoint.torch.save

    def full(obj, path, *a, **k):
        if str(path).endswith("controller.pt") and ".tmp_step_2" in str(path):
            raise OSError(errno.ENOSPC, "No space left on device")
        return real_save(obj, path, *a, **k)

    monkeypatch.setattr(checkpoint.torch, "save", full)
    with pytest.raises(checkpoint.CheckpointError) as info:
        train(load_config(base + ["trainer.total_steps=3"]))
    assert str(info.value) == (
        f"writing checkpoint {run_dir / 'checkpoints' / 'step_2'} failed: OSError: [Errno 28] No space left on "
        f"device; the newest complete checkpoint is {run_dir / 'checkpoints' / 'step_1'}; free space there, then "
        "run again with trainer.resume=auto"
    )
    assert sorted(p.name for p in (run_dir / "checkpoints").iterdir()) == ["step_1"]  # no half-written folder
