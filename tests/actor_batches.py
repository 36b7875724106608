"""Small batches an actor trains on in one process (tests/trainer/test_checkpoint.py,
tests/roles/test_lora_reference.py): ragged rows with the tiny model's own log-probs, under the
quickstart's config cut down to a few rows."""

import torch

from rlpost.config import load_config
from rlpost.data.batch import Batch
from tests.helpers import ragged_generation, reference_logprobs


def batch_for(model, seed: int) -> Batch:
    batch, g = ragged_generation(seed)
    batch["rollout_logprobs"] = reference_logprobs(model, batch)
    batch["old_logprobs"] = batch["rollout_logprobs"].clone()
    batch["advantages"] = torch.randn(8, generator=g)
    return batch


LORA = ["model.lora.rank=4", "model.lora.alpha=8"]


def config(*overrides):
    return load_config(
        [
            "+recipe=quickstart",
            "trainer.world_size=1",
            "trainer.optim.lr=1e-2",
            "trainer.optim.warmup_steps=3",
            "data.train_batch_size=4",
            "rollout.n=2",
            "algo.kl_coef=0",
            "trainer.micro_batch_size=3",
            *overrides,
        ]
    )


def shards_for(model, cfg, seeds=(1, 2)) -> list[Batch]:
    from rlpost.controller.step import step_plan
    from rlpost.data.microbatch import shard_batch

    return [shard_batch(b, step_plan(b, cfg)[1])[0] for b in (batch_for(model, s) for s in seeds)]
