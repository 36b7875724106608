"""A worker group's control methods run beside the calls queued on its actors: with async rollouts
the controller reads the engines' memory after each GPU step while the rollout actors generate, and
that read waited for every generation call queued before it, which held async runs to the
synchronous pace (benchmarks/real_model/async_h200x4.json). The stream's units queued on an actor
run side by side there (`rollout_groups`)."""

import time
from types import SimpleNamespace

import pytest

pytestmark = pytest.mark.integration


class SlowRollout:
    """A rollout actor's shape: `generate` takes seconds, `memory` and `receive_weights` do not."""

    def generate(self, seconds: float) -> float:
        time.sleep(seconds)
        return seconds

    def memory(self) -> dict[str, float]:
        return {"rollout/gpu_used_gb": 1.0}

    def receive_weights(self, version: int) -> int:
        return version


@pytest.mark.parametrize("async_rollouts", [True, False])
def test_async_rollouts_read_memory_and_sync_beside_queued_generation(ray_session, async_rollouts):
    from rlpost.config import load_config
    from rlpost.controller.cluster import WorkerGroup
    from rlpost.controller.workers import rollout_groups

    cfg = load_config(
        [
            "+recipe=quickstart",
            "cluster.placement=split",
            f"algo.async_rollouts={async_rollouts}",
            "rollout.backend=vllm",
        ]
    )
    placement = SimpleNamespace(options=lambda *args: {"num_cpus": 0})
    group = WorkerGroup(SlowRollout, cfg, placement, [0], "rollout", lambda rank: (), groups=rollout_groups(cfg))
    group.call("memory")  # the actor is up
    queued = [group.submit(0, "generate", 3.0) for _ in range(2)]  # a stream's units, 6 s in all
    start = time.monotonic()
    assert group.call("memory") == [{"rollout/gpu_used_gb": 1.0}]
    memory_s = time.monotonic() - start
    if async_rollouts:
        assert group.call("receive_weights", 7) == [7]
        assert time.monotonic() - start < 2.0, "a control method waited for the generation queued before it"
    else:  # the synchronous loop never calls while generating: its calls keep the actor's order
        assert memory_s > 5.0
    assert group.get(queued) == [3.0, 3.0]
    ended = time.monotonic() - start  # async: the queued units ran side by side (vLLM shares its steps)
    assert (ended < 4.5) == async_rollouts, ended
    group.kill()
