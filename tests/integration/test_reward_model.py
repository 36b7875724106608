"""A reward model as a role through the real controller: the reward each logged sample trained on
is the weighted rule score plus the weighted model score recomputed here, validation scores by the
rule alone, and a non-finite model score counts as an error and scores 0."""

import json
import math

import pytest
import torch

from rlpost.config import load_config
from rlpost.controller.run import train
from rlpost.data.tasks import arithmetic_answer
from rlpost.rewards import RewardInput
from rlpost.rewards.builtin import arithmetic
from rlpost.tiny.build import resolve_model_path

pytestmark = pytest.mark.integration


def random_head_classifier(cfg, folder):
    """The tiny policy's body with a new (random) score head: a reward model in seconds."""
    from transformers import AutoModelForSequenceClassification

    from rlpost.models.loading import load_tokenizer

    policy = resolve_model_path(cfg.model, cfg.data)
    torch.manual_seed(0)
    model = AutoModelForSequenceClassification.from_pretrained(policy, num_labels=1)
    model.save_pretrained(folder)
    load_tokenizer(policy).save_pretrained(folder)
    return model.eval()


def test_training_reward_is_the_weighted_rule_and_model_score(ray_session, base_overrides, tmp_path):
    run_dir = tmp_path / "run"
    base = base_overrides(run_dir) + ["trainer.total_steps=2", "logger.samples_per_step=32"]
    model = random_head_classifier(load_config(base), tmp_path / "rm")
    rm = [f"reward.model.path={tmp_path / 'rm'}", "reward.model.sigmoid=true", "reward.model.batch_size=5"]
    cfg = load_config(base + rm + ["reward.rule_weight=0.5", "reward.model.weight=2.0"])
    train(cfg)
    from rlpost.models.loading import load_tokenizer
    from rlpost.rewards.model import classifier_scores

    tok = load_tokenizer(str(tmp_path / "rm"))
    samples = [json.loads(line) for line in (run_dir / "samples.jsonl").read_text().splitlines()]
    assert len(samples) == 2 * 32
    texts = [s["prompt"] + s["response"] for s in samples]
    model_scores = classifier_scores(model, tok, texts, 64, 64, sigmoid=True)
    for s, m in zip(samples, model_scores):
        a, b = (int(x) for x in s["prompt"].rstrip("=").split("+"))
        truth = arithmetic_answer(a + b, cfg.data.arithmetic_digits)
        rule = arithmetic(RewardInput(s["prompt"], s["response"], truth, "arithmetic"))
        assert s["reward"] == pytest.approx(0.5 * rule + 2.0 * m, abs=1e-5)
    rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    steps = [r for r in rows if r["step"] > 0]
    for r in steps:
        assert r["reward/mean"] == pytest.approx(0.5 * r["reward/rule_mean"] + 2.0 * r["reward/model_mean"], abs=1e-5)
        assert r["reward/errors"] == 0
    validations = [r for r in rows if "val/accuracy" in r]
    assert len(validations) == 3  # steps 0, 1, 2
    for r in validations:  # the rule alone: the arithmetic rule scores 0 or 1
        assert r["val/reward_mean"] == pytest.approx(r["val/accuracy"])


NAN_JUDGE = """
def judge(model, tokenizer, prompts, responses):
    return [float("nan") if i % 4 == 0 else 0.25 for i in range(len(prompts))]
"""


def test_non_finite_model_scores_are_counted_and_score_zero(ray_session, base_overrides, tmp_path):
    run_dir = tmp_path / "run"
    (tmp_path / "judge.py").write_text(NAN_JUDGE)
    base = base_overrides(run_dir) + ["trainer.total_steps=1", "trainer.val_every=0", "logger.samples_per_step=32"]
    policy = resolve_model_path(load_config(base).model, load_config(base).data)
    cfg = load_config(
        base
        + [
            f"reward.model.path={policy}",
            "reward.model.kind=causal_lm",
            f"reward.model.score_fn={tmp_path / 'judge.py'}:judge",
            "reward.rule_weight=0",
        ]
    )
    train(cfg)
    samples = [json.loads(line) for line in (run_dir / "samples.jsonl").read_text().splitlines()]
    assert [s["reward"] for s in samples] == [0.0 if i % 4 == 0 else 0.25 for i in range(32)]
    row = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()][-1]
    assert row["reward/errors"] == 8 and math.isfinite(row["reward/mean"])
