"""`retry`: the model answers and, while its answer is not the row's ground truth (compared as
text), is told to try again, up to `env.max_turns` answers. The reward function scores the last
answer as usual. A small environment with no tools, for any task with exact answers."""

from __future__ import annotations

from rlpost.envs.base import ENVS, EnvStep, EpisodeRow, Turn

TRY_AGAIN = "No, try again."


class RetryEnv:
    tools: list = []

    def __init__(self, ground_truth: str):
        self.ground_truth = ground_truth.strip()

    def step(self, turn: Turn) -> EnvStep:
        if turn.text.strip() == self.ground_truth:
            return EnvStep(done=True)
        return EnvStep(messages=[{"role": "user", "content": TRY_AGAIN}])


@ENVS.register("retry")
def retry_env(row: EpisodeRow, options) -> RetryEnv:
    return RetryEnv(row.ground_truth)
