"""Reward models: scores against a plain per-text forward written here, the causal-LM score
function's contract, the weighting with the rule, and the tiny reward model's quality."""

import math
import random

import pytest
import torch

from rlpost.config import load_config
from rlpost.rewards.model import classifier_scores, combine
from rlpost.roles.reward_model import RewardModelWorker
from rlpost.tiny.model import build_char_tokenizer, tiny_qwen2_config


def tiny_classifier(tmp_path, labels: int):
    """A random Qwen2 sequence classifier and its character tokenizer, saved to `tmp_path`."""
    from transformers import Qwen2ForSequenceClassification

    torch.manual_seed(0)
    tok = build_char_tokenizer()
    config = tiny_qwen2_config(len(tok), 32, 2, 4, 2, 64, 64, tok.pad_token_id, tok.eos_token_id)
    config.num_labels = labels
    model = Qwen2ForSequenceClassification(config).eval()
    model.save_pretrained(tmp_path)
    tok.save_pretrained(tmp_path)
    return model, tok


def reference_score(model, tok, text: str, labels: int) -> float:
    """One text alone, no padding: the head applied to the hidden state of its last token."""
    ids = torch.tensor([tok(text, add_special_tokens=False).input_ids])
    with torch.no_grad():
        hidden = model.model(input_ids=ids).last_hidden_state[0, -1]
        logits = model.score(hidden)
    return float(logits[0] if labels == 1 else logits[1] - logits[0])


TEXTS = ["12+34=46", "7+8=15", "99+99=198", "1+1=3", "5+5=", "40+2=42 and more"]


@pytest.mark.parametrize("labels", [1, 2])
@pytest.mark.parametrize("sigmoid", [False, True])
def test_classifier_scores_equal_each_text_scored_alone(tmp_path, labels, sigmoid):
    model, tok = tiny_classifier(tmp_path, labels)
    got = classifier_scores(model, tok, TEXTS, batch_size=4, max_length=64, sigmoid=sigmoid)  # padded, 2 batches
    want = [reference_score(model, tok, t, labels) for t in TEXTS]
    if sigmoid:
        want = [1 / (1 + math.exp(-w)) for w in want]
    assert got == pytest.approx(want, abs=1e-5)
    assert len(set(round(g, 6) for g in got)) == len(TEXTS)  # the texts are told apart


def test_classifier_truncates_to_max_length(tmp_path):
    model, tok = tiny_classifier(tmp_path, 1)
    got = classifier_scores(model, tok, ["12+34=46"], batch_size=4, max_length=5, sigmoid=False)
    assert got == pytest.approx([reference_score(model, tok, "12+34", 1)], abs=1e-5)


def test_classifier_with_three_labels_is_refused(tmp_path):
    model, tok = tiny_classifier(tmp_path, 3)
    with pytest.raises(ValueError, match="1 or 2 labels, this one has 3"):
        classifier_scores(model, tok, TEXTS, 4, 64, False)


def test_worker_reads_prompt_then_response(tmp_path):
    model, tok = tiny_classifier(tmp_path, 1)
    cfg = load_config(["+recipe=quickstart", f"reward.model.path={tmp_path}", "reward.model.batch_size=2"])
    worker = RewardModelWorker(cfg, str(tmp_path), 0)
    got = worker.score(["12+34=", "7+8="], ["46", "15"])
    assert got == pytest.approx([reference_score(model, tok, t, 1) for t in ("12+34=46", "7+8=15")], abs=1e-5)


JUDGE = '''
import torch

def judge(model, tokenizer, prompts, responses):
    """The mean log-prob of the response's characters after the prompt (a causal-LM judge)."""
    out = []
    for p, r in zip(prompts, responses):
        ids = torch.tensor([tokenizer(p + r, add_special_tokens=False).input_ids])
        logp = torch.log_softmax(model(input_ids=ids).logits[0, :-1], -1)
        targets = ids[0, 1:]
        n = len(tokenizer(r, add_special_tokens=False).input_ids)
        out.append(logp[-n:].gather(-1, targets[-n:, None]).mean().item())
    return out

def short(model, tokenizer, prompts, responses):
    return [0.0]
'''


def test_causal_lm_scored_by_the_user_function(tmp_path):
    from transformers import Qwen2ForCausalLM

    torch.manual_seed(0)
    tok = build_char_tokenizer()
    lm = Qwen2ForCausalLM(tiny_qwen2_config(len(tok), 32, 2, 4, 2, 64, 64, tok.pad_token_id, tok.eos_token_id))
    lm.save_pretrained(tmp_path / "lm")
    tok.save_pretrained(tmp_path / "lm")
    (tmp_path / "judge.py").write_text(JUDGE)
    base = ["+recipe=quickstart", f"reward.model.path={tmp_path / 'lm'}", "reward.model.kind=causal_lm"]
    cfg = load_config(base + [f"reward.model.score_fn={tmp_path / 'judge.py'}:judge"])
    worker = RewardModelWorker(cfg, str(tmp_path / "lm"), 0)
    got = worker.score(["12+34=", "7+8="], ["46", "15"])
    with torch.no_grad():  # the same judgement, by hand
        want = []
        for text, n in (("12+34=46", 2), ("7+8=15", 2)):
            ids = torch.tensor([tok(text, add_special_tokens=False).input_ids])
            logp = torch.log_softmax(lm(input_ids=ids).logits[0, :-1], -1)
            want.append(logp[-n:].gather(-1, ids[0, -n:, None]).mean().item())
    assert got == pytest.approx(want, abs=1e-5) and got[0] != got[1]
    cfg = load_config(base + [f"reward.model.score_fn={tmp_path / 'judge.py'}:short"])
    with pytest.raises(ValueError, match=r"judge.py:short' returned 1 scores for 2 samples"):
        RewardModelWorker(cfg, str(tmp_path / "lm"), 0).score(["1+1=", "2+2="], ["2", "4"])


def test_combine_weights_rule_and_model():
    rule, model = torch.tensor([1.0, 0.0, 1.0]), torch.tensor([0.2, 0.9, -1.0])
    assert torch.equal(combine(rule, model, 0.5, 2.0), torch.tensor([0.9, 1.8, -1.5]))
    assert torch.equal(combine(rule, None, 0.5, 2.0), torch.tensor([0.5, 0.0, 0.5]))


@pytest.mark.demo
@pytest.mark.slow  # a reward model on 2/3 of the recipe's steps, from the quickstart's start model: ~2.5 min
def test_tiny_reward_model_tells_right_from_wrong_on_held_out_problems(built_models):
    """Answers it never saw: the right one, the one that drops the carry, a changed digit."""
    from transformers import AutoModelForSequenceClassification

    from rlpost.data.tasks import arithmetic_split, units_carry
    from rlpost.models.loading import load_tokenizer
    from rlpost.tiny.build import resolve_model_path
    from rlpost.tiny.reward import BUILD, ensure_tiny_reward_model

    cfg = load_config(["+recipe=grpo_rm", f"model.cache_dir={built_models}"])
    build = {**BUILD, "steps": 2000, "problems": 1500, "samples": 2}
    policy = resolve_model_path(cfg.model, cfg.data)
    path = ensure_tiny_reward_model(policy, cfg.data.arithmetic_digits, cfg.data.val_size, build=build)
    model = AutoModelForSequenceClassification.from_pretrained(path).eval()
    tok = load_tokenizer(path)
    _, val = arithmetic_split(cfg.data.arithmetic_digits, seed=0, num_val=cfg.data.val_size)
    rng = random.Random(1)
    right, slipped, changed = [], [], []
    for row in val:
        p, a = row["prompt"], row["ground_truth"]
        right.append(p + a)
        if units_carry(row):
            slipped.append(p + str(int(a) - 10).zfill(len(a)))
        i = rng.randrange(len(a))
        changed.append(p + a[:i] + str((int(a[i]) + rng.randrange(1, 10)) % 10) + a[i + 1 :])
    scores = {
        name: torch.tensor(classifier_scores(model, tok, texts, 256, 64, sigmoid=True))
        for name, texts in (("right", right), ("slipped", slipped), ("changed", changed))
    }
    assert (scores["right"] > 0.5).float().mean() >= 0.9
    assert (scores["slipped"] < 0.5).float().mean() >= 0.6
    # 0.699 since decoding keeps the spaces and newlines a sampled answer holds (load_tokenizer;
    # it used to drop them, and such an answer trained the classifier as if it had none)
    assert (scores["changed"] < 0.5).float().mean() >= 0.65
    assert scores["right"].mean() > scores["slipped"].mean() + 0.3
