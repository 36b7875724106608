"""The rules about how a batch is cut: into optimizer steps (`algo.ppo_mini_batch_size`) and over the
trainer ranks (each a named function of `rules.RULES`, registered by `rules.rule`, with a violating
example in tests/config/test_config.py)."""

from __future__ import annotations

from rlpost.config.rules import rule
from rlpost.config.schema import mini_batch_size


@rule("algo.ppo_mini_batch_size")
def mini_batch_divides_batch(cfg):
    if cfg.data.train_batch_size % mini_batch_size(cfg):
        return (
            f"algo.ppo_mini_batch_size={mini_batch_size(cfg)} must divide data.train_batch_size="
            f"{cfg.data.train_batch_size}"
        )


@rule("trainer.world_size")
def ranks_divide_mini_batch(cfg):
    rows, ws = mini_batch_size(cfg) * cfg.rollout.n, cfg.trainer.world_size
    if rows % ws:  # (named by the keys in effect: a mini-batch of 0 is the whole batch, the sixteenth's t62)
        prompts = (
            f"algo.ppo_mini_batch_size={cfg.algo.ppo_mini_batch_size}"
            if cfg.algo.ppo_mini_batch_size
            else f"data.train_batch_size={cfg.data.train_batch_size} (algo.ppo_mini_batch_size=0: the whole batch)"
        )
        fits = [n for n in range(1, min(rows, 64) + 1) if rows % n == 0 and n <= 2 * ws][-4:]
        return (
            f"each optimizer step sees {prompts} x rollout.n={cfg.rollout.n} = {rows} sequences, which "
            f"trainer.world_size={ws} does not divide: use {', '.join(map(str, fits))} ranks, or a batch {ws} divides"
        )
