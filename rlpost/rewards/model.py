"""Reward models: how a model's scores are read and weighted with the rule's (the worker that
serves the model is `rlpost.roles.reward_model.RewardModelWorker`).

`reward.model.path` names the model; `reward.model.kind` says how it scores:
- `classifier`: a sequence-classification model (`AutoModelForSequenceClassification`) reads
  `prompt + response` in its own tokenizer; the score is its logit (one label, a Bradley-Terry
  reward model as TRL's `RewardTrainer` and OpenRLHF train them), or with two labels the logit of
  label 1 minus that of label 0. `reward.model.sigmoid` maps it to (0, 1).
- `causal_lm`: a causal LM scored by a user function `reward.model.score_fn=file.py:name`, called
  as `name(model, tokenizer, prompts, responses) -> list[float]` once per batch (an LLM judge,
  the log-likelihood of a reference, ...).

The controller starts one reward-model worker per trainer rank, on the trainer's device, and
splits each step's samples over them. The training reward of a sample is
`reward.rule_weight * rule + reward.model.weight * model_score` (`combine`); validation scores by
the rules only, so `val/accuracy` stays the task's own measure.
"""

from __future__ import annotations

import torch


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
