"""Async rollouts (`algo.async_rollouts`): with `algo.max_staleness=0` they train bit for bit what
the synchronous loop trains, killed and resumed included (the ledger relaunches the units under
way with their seeds); ahead of the trainer (`max_staleness=2`) a killed and resumed run trains
every drawn prompt exactly once, in the uninterrupted run's order."""

import json
from collections import Counter

import pytest
import torch

from rlpost.config import load_config
from rlpost.controller import loop
from rlpost.controller.run import train
from tests.helpers import PROBLEMS, Crash, assert_equal, trainer_state, write_rows

pytestmark = [pytest.mark.integration, pytest.mark.slow]


def overrides(base_overrides, tmp_path, run_dir, steps, *extra):
    # 10 rows, 4 prompts a step: an epoch is 2 draws (the incomplete batch is dropped)
    train_file = write_rows(tmp_path / "train.jsonl", PROBLEMS)
    return base_overrides(run_dir) + [
        "data.task=",
        f"data.train_files=[{train_file}]",
        f"data.val_files=[{train_file}]",
        "data.train_batch_size=4",
        "rollout.n=2",
        f"trainer.total_steps={steps}",
        "trainer.save_every=2",
        "trainer.keep_checkpoints=5",
        "trainer.val_every=0",
        "cluster.placement=split",
        "logger.samples_per_step=100",
        "trainer.optim.lr=3e-3",
        "algo.entropy_coef=0.01",  # a gradient although the barely warmed-up model earns no reward
        *extra,
    ]


def steps_of(run_dir) -> dict[int, list]:
    """{step: [(prompt, response)]} from samples.jsonl (every sample is logged)."""
    steps: dict[int, list] = {}
    for line in (run_dir / "samples.jsonl").read_text().splitlines():
        row = json.loads(line)
        steps.setdefault(row["step"], []).append((row["prompt"], row["response"]))
    return steps


def metrics_of(run_dir) -> list[dict]:
    """The training steps' rows of metrics.jsonl (not the start's)."""
    rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    return [row for row in rows if "reward/mean" in row]


def crashed_and_resumed(monkeypatch, config, crash_at: int) -> None:
    real_step = loop.Controller.train_step

    def crash(self):
        if self.step + 1 == crash_at:
            raise Crash(f"killed during step {crash_at}")
        return real_step(self)

    monkeypatch.setattr(loop.Controller, "train_step", crash)
    with pytest.raises(Crash):
        train(load_config(config))
    monkeypatch.setattr(loop.Controller, "train_step", real_step)
    train(load_config(config + ["trainer.resume=auto"]))


def test_zero_staleness_trains_exactly_what_the_synchronous_loop_trains_killed_and_resumed_too(
    ray_session, base_overrides, tmp_path, monkeypatch
):
    steps, two_actors = 4, ["rollout.num_workers=2", "algo.max_staleness=0"]  # each draw: two units
    sync, stream = tmp_path / "sync", tmp_path / "async"
    train(load_config(overrides(base_overrides, tmp_path, sync, steps, *two_actors)))
    crashed_and_resumed(
        monkeypatch, overrides(base_overrides, tmp_path, stream, steps, *two_actors, "algo.async_rollouts=true"), 3
    )
    a, b = steps_of(sync), steps_of(stream)
    assert sorted(a) == sorted(b) == list(range(1, steps + 1))
    for step in a:  # each step's prompts, in order, and every sampled completion
        assert a[step] == b[step], f"step {step} differs"
    final_a, final_b = (trainer_state(run / "checkpoints" / f"step_{steps}") for run in (sync, stream))
    assert_equal(final_a, final_b)
    start = trainer_state(sync / "checkpoints" / "step_2")
    assert any(not torch.equal(v, start["dcp"]["model"][k]) for k, v in final_a["dcp"]["model"].items())
    m = metrics_of(stream)
    assert [row["async/staleness_mean"] for row in m] == [0.0] * steps


def test_ahead_of_the_trainer_a_killed_and_resumed_run_trains_every_drawn_prompt_once(
    ray_session, base_overrides, tmp_path, monkeypatch
):
    steps, ahead = 6, ["algo.async_rollouts=true", "algo.max_staleness=2"]
    straight, killed = tmp_path / "straight", tmp_path / "killed"
    train(load_config(overrides(base_overrides, tmp_path, straight, steps, *ahead)))
    crashed_and_resumed(monkeypatch, overrides(base_overrides, tmp_path, killed, steps, *ahead), 4)
    a, b = steps_of(straight), steps_of(killed)
    prompts = {run: {s: [p for p, _ in rows[::2]] for s, rows in steps.items()} for run, steps in (("a", a), ("b", b))}
    assert prompts["a"] == prompts["b"]  # each step's prompts, in the order of the draws
    for epoch in range(steps // 2):  # each epoch: 8 of the 10 prompts (a draw of 4 twice), each once
        seen = Counter(p for s in (2 * epoch + 1, 2 * epoch + 2) for p in prompts["b"][s])
        assert len(seen) == 8 and set(seen.values()) == {1} and set(seen) <= set(PROBLEMS)
    assert [s for s in prompts["a"]] == list(range(1, steps + 1))
    m = metrics_of(killed)
    assert [row["step"] for row in m] == list(range(1, steps + 1))
    assert max(row["async/staleness_mean"] for row in m) >= 1  # it did generate ahead of the trainer
    assert all(row["rollout/staleness"] <= 2 for row in m)
    controller = torch.load(killed / "checkpoints" / f"step_{steps}" / "controller.pt", weights_only=False)
    ledger = controller["stream"]
    assert ledger["draws"] * 4 == steps * 4 + sum(len(u.rows) for u in ledger["units"]) + len(ledger["ready"])


# ------------------------------------------------------------- the stale-group policy, alone
class FakeGroup:
    """Rollout actors that answer at once (`ray.put`), with the weight version the test sets."""

    def __init__(self, actors: int):
        from rlpost.controller.cluster import Deadlines

        self.actors, self.version, self.calls, self.labels = actors, 0, [], {}
        self.deadlines = Deadlines(timeout_s=30)

    def __len__(self):
        return self.actors

    def submit(self, rank, method, prompts, params):
        import ray

        from rlpost.data.batch import Batch

        self.calls.append((rank, [p[0] for p in prompts], params.seed))
        rows = len(prompts) * params.n
        batch = Batch(
            {
                "prompt_ids": torch.tensor([p for p in prompts for _ in range(params.n)]),
                "prompt_mask": torch.ones(rows, 1, dtype=torch.bool),
                "response_ids": torch.full((rows, 2), params.seed % 97),
                "response_mask": torch.ones(rows, 2, dtype=torch.bool),
                "loss_mask": torch.ones(rows, 2, dtype=torch.bool),
                "rollout_logprobs": torch.zeros(rows, 2),
                "weight_version": torch.full((rows,), self.version),
            }
        )
        return ray.put(batch)

    def get(self, refs):
        import ray

        return ray.get(refs)


class FakeRollouts:
    """What a `Stream` uses of `Rollouts`: config, loader, seeds, the job, scoring, the busy clock."""

    def __init__(self, cfg, actors: int):
        from rlpost.controller.rollouts import BusyClock
        from rlpost.data.dataset import PromptLoader, PromptRow

        self.cfg, self.pad_id, self.group, self.busy = cfg, 0, FakeGroup(actors), BusyClock()
        self.loader = PromptLoader([PromptRow([i], f"p{i}", "", "") for i in range(12)], 4, seed=0, shuffle=False)

    def seed(self, draw):
        return 1000 * draw

    def _job(self, rows):
        return "generate", [r.prompt_ids for r in rows]

    def score(self, rows, batch, n):
        return torch.zeros(len(batch)), {"errors": 0}, [""] * len(batch)


@pytest.mark.parametrize("policy", ["regenerate", "drop"])
def test_groups_older_than_the_bound_are_generated_again_or_dropped(ray_session, policy):
    from rlpost.controller.stream import Stream

    cfg = load_config(["+recipe=quickstart", "data.train_batch_size=4", "rollout.n=2", "algo.max_staleness=1"])
    cfg.algo.stale_groups = policy
    fake = FakeRollouts(cfg, actors=1)
    stream = Stream(fake)
    first = stream.next(step=0, version=0)  # draws 0 and 1 start (the bound: two batches out)
    assert [r.prompt_text for r in first.rows] == ["p0", "p1", "p2", "p3"]
    assert fake.group.calls == [(0, [0, 1, 2, 3], 0), (0, [4, 5, 6, 7], 1000)]
    assert first.metrics["async/ready_groups"] == 4.0
    fake.group.version = 3  # the trainer is 3 versions on: draw 1 (version 0) lags more than 1
    batches = [stream.next(step=1, version=3), stream.next(step=2, version=3)]
    trained = [r.prompt_text for b in batches for r in b.rows]
    for b in batches:
        assert torch.equal(b.batch["weight_version"], torch.full((8,), 3)) and b.metrics["async/staleness_mean"] == 0
    counted = {k: sum(b.metrics[f"async/{k}_groups"] for b in batches) for k in ("regenerated", "dropped")}
    if policy == "regenerate":  # draw 1's prompts generated again, each alone with a seed of its own, first
        assert trained == ["p4", "p5", "p8", "p9", "p6", "p7", "p10", "p11"]
        again = [c for c in fake.group.calls if len(c[1]) == 1]
        assert [c[1] for c in again] == [[4], [5], [6], [7]] and len({c[2] for c in fake.group.calls}) == 8
        assert counted == {"regenerated": 4, "dropped": 0}
    else:  # draw 1 skipped: draws 2 and 3 train
        assert trained == [f"p{i}" for i in (8, 9, 10, 11, 0, 1, 2, 3)]  # (draw 3: the next epoch)
        assert counted == {"regenerated": 0, "dropped": 4}
