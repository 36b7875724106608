"""The GPUs' idle time in split placement (issue 41): the rollout actors stamp their generation
seconds on their rows, `BusyClock` adds up what each step's batches brought, and
`idle_fractions` turns it and the trainer's phases into the share of a step each side sat idle."""

import pytest
import torch

from rlpost.config import load_config
from rlpost.controller.rollouts import BusyClock
from rlpost.controller.step import idle_fractions
from rlpost.data.batch import Batch
from rlpost.rollout.base import SamplingParams
from rlpost.rollout.worker import RolloutWorker
from tests.helpers import save_tiny_model


def stamped(rank_totals: list[tuple[int, float]], life: int = 7) -> Batch:
    """A batch of one row per (rank, total so far), as `RolloutWorker._stamped` leaves them."""
    ranks = torch.tensor([r for r, _ in rank_totals])
    return Batch(
        {
            "response_ids": torch.zeros(len(rank_totals), 2, dtype=torch.long),
            "rollout_rank": ranks,
            "rollout_life": torch.full_like(ranks, life),
            "rollout_busy_s": torch.tensor([t for _, t in rank_totals], dtype=torch.float64),
        }
    )


def test_the_clock_adds_each_actors_new_seconds_once_and_takes_the_stamps_off():
    clock = BusyClock()
    first = stamped([(0, 2.0), (0, 2.0), (1, 3.0)])  # two rows of one call on actor 0
    clock.observe(first)
    assert not {"rollout_rank", "rollout_life", "rollout_busy_s"} & set(first.tensors)
    assert clock.take() == 5.0
    clock.observe(stamped([(0, 2.5), (1, 3.0)]))  # actor 1 did nothing new
    clock.observe(stamped([(1, 4.0)]))
    assert clock.take() == 1.5
    assert clock.take() == 0.0


def test_a_restarted_actor_counts_from_zero():
    clock = BusyClock()
    clock.observe(stamped([(0, 10.0)]))
    clock.take()
    clock.observe(stamped([(0, 11.5)], life=8))  # a new actor of rank 0: its own total
    assert clock.take() == 11.5


def test_calls_that_ran_side_by_side_count_once_whatever_order_they_are_seen_in():
    """Async rollouts on vLLM run an actor's queued calls side by side: the one that ended later
    can be seen first; the earlier one's smaller total then adds nothing (it is not a restart)."""
    clock = BusyClock()
    clock.observe(stamped([(0, 9.0)]))
    clock.observe(stamped([(0, 6.0)]))
    assert clock.take() == 9.0
    clock.observe(stamped([(0, 10.0)]))
    assert clock.take() == 1.0


def test_a_batch_without_stamps_adds_nothing():
    clock = BusyClock()
    clock.observe(Batch({"response_ids": torch.zeros(2, 2)}))
    assert clock.take() == 0.0


def split_cfg(**extra):
    args = ["+recipe=quickstart", "cluster.placement=split", "rollout.num_workers=2", "trainer.world_size=1"]
    return load_config(args + [f"{k}={v}" for k, v in extra.items()])


def test_idle_fractions_by_hand():
    metrics = {
        "timing_s/step": 10.0,
        "timing_s/gen": 4.0,  # the trainer waits: idle
        "timing_s/reward": 1.0,
        "timing_s/logprob": 1.0,
        "timing_s/update": 3.0,
        "timing_s/weight_sync": 0.5,
        "perf/rollout_busy_s": 12.0,  # over 2 engines: 12 of 20 engine-seconds
    }
    assert idle_fractions(split_cfg(), metrics) == {
        "perf/trainer_idle_frac": pytest.approx(0.55),
        "perf/rollout_idle_frac": pytest.approx(0.4),
    }
    colocated = load_config(["+recipe=quickstart"])
    assert idle_fractions(colocated, metrics) == {}


def test_the_rollout_worker_stamps_its_rank_and_growing_seconds(tmp_path):
    save_tiny_model(tmp_path, hidden=32, layers=2, intermediate=64)
    cfg = load_config(["+recipe=quickstart", f"model.path={tmp_path}"])
    worker = RolloutWorker(cfg, str(tmp_path), 3, 0, 1)
    params = SamplingParams(n=2, temperature=1.0, max_tokens=4, seed=0)
    one = worker.generate([[1, 2, 3]], params)
    two = worker.generate([[1, 2], [3, 4]], params)
    assert one["rollout_rank"].tolist() == [3, 3] and two["rollout_rank"].tolist() == [3] * 4
    first, second = one["rollout_busy_s"][0].item(), two["rollout_busy_s"][0].item()
    assert 0 < first < second and second == pytest.approx(worker.busy_s)
    assert one["rollout_busy_s"].dtype == torch.float64


def test_the_engines_memory_is_the_largest_figure_of_any_engine():
    """Each rollout engine reports its device's memory (awake, and right after it last slept); with
    several engines the step logs the largest of each figure, not whichever engine answered last."""
    from rlpost.controller.progress import largest

    reports = [
        {"rollout/gpu_used_gb": 70.0, "rollout/asleep_gpu_used_gb": 12.0},
        {"rollout/gpu_used_gb": 75.0, "rollout/asleep_gpu_used_gb": 9.0},
        {"rollout/gpu_used_gb": 72.0},  # an engine that has not slept yet
    ]
    assert largest(reports) == {"rollout/gpu_used_gb": 75.0, "rollout/asleep_gpu_used_gb": 12.0}
    assert largest([]) == {} and largest([{}, {}]) == {}


class SleepyEngine:
    """A rollout engine whose generation takes `seconds`; notes how many calls ran at once."""

    def __init__(self, concurrent: bool, seconds: float = 0.4):
        import threading

        self.concurrent, self.seconds = concurrent, seconds
        self.at_once, self.most, self.lock = 0, 0, threading.Lock()

    def generate(self, prompts, params):
        import time

        with self.lock:
            self.at_once += 1
            self.most = max(self.most, self.at_once)
        time.sleep(self.seconds)
        with self.lock:
            self.at_once -= 1
        return Batch({"response_ids": torch.zeros(len(prompts), 2, dtype=torch.long)})


@pytest.mark.parametrize("concurrent", [True, False])
def test_generation_calls_run_side_by_side_only_on_an_engine_that_shares_its_steps(concurrent):
    """Ray runs the stream's queued calls on threads of the actor (`rollout_groups`); an engine
    that is not `concurrent` (HF, vLLM outside async rollouts) takes them one at a time. `busy_s`
    is the time in which a call was under way: two calls side by side count once."""
    import threading
    import time

    worker = object.__new__(RolloutWorker)
    worker.rank, worker.life, worker.busy_s = 0, 1, 0.0
    worker._clock, worker._since, worker._calls, worker._one_call = threading.Lock(), 0.0, 0, threading.Lock()
    worker.engine = SleepyEngine(concurrent)
    start = time.perf_counter()
    threads = [threading.Thread(target=worker.generate, args=([[1]], None)) for _ in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    wall = time.perf_counter() - start
    assert worker.engine.most == (2 if concurrent else 1)
    assert worker.busy_s == pytest.approx(wall, abs=0.1)  # side by side: 0.4 s, not 0.8
    assert (wall < 0.7) == concurrent
