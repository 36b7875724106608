"""The `reward_model` role: one reward model on one device, scoring (prompt, response) pairs in
batches (how it scores: `rlpost.rewards.model`)."""

from __future__ import annotations

import torch

from rlpost.data.userfile import load_from_file
from rlpost.models.loading import DTYPES, load_tokenizer
from rlpost.rewards.model import classifier_scores


def load_reward_model(path: str, kind: str, dtype: str, attn_implementation: str, trust_remote_code: bool):
    """The reward model at `path` in eval mode: a sequence classifier, or a causal LM."""
    from transformers import AutoModelForCausalLM, AutoModelForSequenceClassification

    cls = AutoModelForSequenceClassification if kind == "classifier" else AutoModelForCausalLM
    model = cls.from_pretrained(
        path, dtype=DTYPES[dtype], attn_implementation=attn_implementation, trust_remote_code=trust_remote_code
    )
    return model.eval()


class ScoreFnError(ValueError):
    """`reward.model.score_fn` returned no list of one number per sample: the controller says it as
    the function's error, not as a death of the actor."""


class RewardModelWorker:
    """One reward model on one device (a Ray actor of the `reward_model` role)."""

    def __init__(self, cfg, path: str, rank: int):
        """`cfg`: the run's TrainConfig (`reward.model`, `model`, `trainer.device`)."""
        torch.set_num_threads(cfg.cluster.num_threads)
        m = self.cfg = cfg.reward.model
        self.device = torch.device("cuda", torch.cuda.current_device()) if cfg.trainer.device == "cuda" else "cpu"
        self.tokenizer = load_tokenizer(path, cfg.model.trust_remote_code)
        attn = "sdpa" if cfg.model.attn_implementation == "rlpost_varlen" else cfg.model.attn_implementation
        self.model = load_reward_model(path, m.kind, cfg.model.dtype, attn, cfg.model.trust_remote_code)
        self.model.to(self.device)
        if self.model.config.pad_token_id is None:  # the classifier finds each text's last token by it
            self.model.config.pad_token_id = self.tokenizer.pad_token_id
        self.user_fn = load_from_file(m.score_fn, "reward.model.score_fn") if m.kind == "causal_lm" else None
        self.rank = rank

    def score(self, prompts: list[str], responses: list[str]) -> list[float]:
        """One score per (prompt, response), non-finite ones included: the controller counts
        those as reward errors. A `score_fn` that raises stops the run with its error."""
        if self.user_fn is None:
            texts = [p + r for p, r in zip(prompts, responses)]
            return classifier_scores(
                self.model, self.tokenizer, texts, self.cfg.batch_size, self.cfg.max_length, self.cfg.sigmoid
            )
        with torch.no_grad():
            out = self.user_fn(self.model, self.tokenizer, prompts, responses)
        try:
            scores = [float(s) for s in out]
        except (TypeError, ValueError) as e:  # (one float: "died", its error lost: the 18th catalogue's t43)
            raise ScoreFnError(
                f"reward.model.score_fn={self.cfg.score_fn!r} returned {str(out)[:60]} ({type(out).__name__}), not one "
                f"number per sample (a list of {len(prompts)}): {e}"
            ) from None
        if len(scores) != len(prompts):
            raise ScoreFnError(
                f"reward.model.score_fn={self.cfg.score_fn!r} returned {len(scores)} scores for {len(prompts)} samples"
            )
        return scores

    def memory_report(self) -> dict[str, float]:
        """What the reward model keeps on its GPU (colocated memory check); {} on the CPU."""
        if self.device == "cpu":
            return {}
        free, total = torch.cuda.mem_get_info(self.device)
        return {"total": float(total), "free": float(free), "resident": float(torch.cuda.memory_allocated(self.device))}
