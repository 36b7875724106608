"""Reward models: a worker that scores (prompt, response) pairs with a model, batched.

`reward.model.path` names the model; `reward.model.kind` says how it scores:
- `classifier`: a sequence-classification model (`AutoModelForSequenceClassification`) reads
  `prompt + response` in its own tokenizer; the score is its logit (one label, a Bradley-Terry
  reward model as TRL's `RewardTrainer` and OpenRLHF train them), or with two labels the logit of
  label 1 minus that of label 0. `reward.model.sigmoid` maps it to (0, 1).
- `causal_lm`: a causal LM scored by a user function `reward.model.score_fn=file.py:name`, called
  as `name(model, tokenizer, prompts, responses) -> list[float]` once per batch (an LLM judge,
  the log-likelihood of a reference, ...).

The controller starts one `RewardModelWorker` per trainer rank, on the trainer's device, and
splits each step's samples over them. The training reward of a sample is
`reward.rule_weight * rule + reward.model.weight * model_score` (`combine`); validation scores by
the rules only, so `val/accuracy` stays the task's own measure.
"""

from __future__ import annotations

import torch

from rlpost.config import TrainConfig
from rlpost.models.loading import DTYPES
from rlpost.rewards.base import load_user_fn


def combine(rule: torch.Tensor, model: torch.Tensor | None, rule_weight: float, model_weight: float) -> torch.Tensor:
    """The training reward: the rule score and the model score, weighted."""
    out = rule_weight * rule
    return out if model is None else out + model_weight * model


@torch.no_grad()
def classifier_scores(
    model, tokenizer, texts: list[str], batch_size: int, max_length: int, sigmoid: bool
) -> list[float]:
    """The score of each text by a sequence-classification model, `batch_size` texts per forward
    (right-padded; the model reads its logits at each text's last token)."""
    device = next(model.parameters()).device
    labels = model.config.num_labels
    if labels not in (1, 2):
        raise ValueError(f"reward.model.path: a classifier reward model has 1 or 2 labels, this one has {labels}")
    out: list[float] = []
    for i in range(0, len(texts), batch_size):
        enc = tokenizer(
            texts[i : i + batch_size],
            add_special_tokens=False,
            padding=True,
            padding_side="right",
            truncation=True,
            max_length=max_length,
            return_tensors="pt",
        ).to(device)
        logits = model(input_ids=enc.input_ids, attention_mask=enc.attention_mask).logits.float()
        score = logits[:, 0] if labels == 1 else logits[:, 1] - logits[:, 0]
        out += (torch.sigmoid(score) if sigmoid else score).tolist()
    return out


def load_reward_model(path: str, kind: str, dtype: str, attn_implementation: str, trust_remote_code: bool):
    """The reward model at `path` in eval mode: a sequence classifier, or a causal LM."""
    from transformers import AutoModelForCausalLM, AutoModelForSequenceClassification

    cls = AutoModelForSequenceClassification if kind == "classifier" else AutoModelForCausalLM
    model = cls.from_pretrained(
        path, dtype=DTYPES[dtype], attn_implementation=attn_implementation, trust_remote_code=trust_remote_code
    )
    return model.eval()


class RewardModelWorker:
    """One reward model on one device (a Ray actor of the `reward_model` role)."""

    def __init__(self, cfg: TrainConfig, path: str, rank: int):
        from rlpost.models.loading import load_tokenizer

        torch.set_num_threads(cfg.cluster.num_threads)
        m = self.cfg = cfg.reward.model
        self.device = torch.device("cuda", torch.cuda.current_device()) if cfg.trainer.device == "cuda" else "cpu"
        self.tokenizer = load_tokenizer(path, cfg.model.trust_remote_code)
        attn = "sdpa" if cfg.model.attn_implementation == "rlpost_varlen" else cfg.model.attn_implementation
        self.model = load_reward_model(path, m.kind, cfg.model.dtype, attn, cfg.model.trust_remote_code)
        self.model.to(self.device)
        if self.model.config.pad_token_id is None:  # the classifier finds each text's last token by it
            self.model.config.pad_token_id = self.tokenizer.pad_token_id
        self.user_fn = load_user_fn(m.score_fn) if m.kind == "causal_lm" else None
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
            scores = [float(s) for s in self.user_fn(self.model, self.tokenizer, prompts, responses)]
        if len(scores) != len(prompts):
            raise ValueError(
                f"reward.model.score_fn={self.cfg.score_fn!r} returned {len(scores)} scores for {len(prompts)} samples"
            )
        return scores

    def memory_report(self) -> dict[str, float]:
        """What the reward model keeps on its GPU (colocated memory check); {} on the CPU."""
        if self.device == "cpu":
            return {}
        free, total = torch.cuda.mem_get_info(self.device)
        return {"total": float(total), "free": float(free), "resident": float(torch.cuda.memory_allocated(self.device))}
