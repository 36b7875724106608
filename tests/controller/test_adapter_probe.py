"""When a LoRA run spends the base model's forward on checking that the rollouts serve the
adapter (`controller/adapter_probe.py`): from the first batch of an adapter-holding generator
until the check passes, backing off while it cannot tell, again after each validation."""

import pytest
import torch

from rlpost.controller.adapter_probe import AdapterProbe
from rlpost.controller.step import AdapterNotServedError
from rlpost.data.batch import Batch


def batch(rollout_to: str, version: int = 1, ref: bool = True) -> Batch:
    """Log-probs of 2 x 3 tokens: the rollout's equal to the policy's, the base's, or between."""
    torch.manual_seed(0)
    policy, base = torch.randn(2, 3), torch.randn(2, 3)
    rollout = {"policy": policy, "base": base, "between": (policy + base) / 2}[rollout_to]
    rows = {
        "rollout_logprobs": rollout, "old_logprobs": policy, "ref_logprobs": base,
        "loss_mask": torch.ones(2, 3, dtype=torch.bool), "weight_version": torch.full((2,), version),
    }  # fmt: skip
    return Batch({k: v for k, v in rows.items() if ref or k != "ref_logprobs"})


def due_steps(probe: AdapterProbe, steps: range, rollout_to: str = "between") -> list[int]:
    out = []
    for step in steps:
        b = batch(rollout_to)
        if probe.due(step, b, staleness=0):
            out.append(step)
            probe.check(step, b, staleness=0)
    return out


def test_an_inconclusive_check_backs_off_to_every_max_wait_steps():
    assert due_steps(AdapterProbe(True, max_wait=8), range(40)) == [0, 1, 3, 7, 15, 23, 31, 39]


def test_a_passed_check_is_not_due_until_a_validation_rearms_it():
    probe = AdapterProbe(True)
    assert due_steps(probe, range(5), "policy") == [0]
    probe.rearm()
    assert due_steps(probe, range(5, 8), "policy") == [5]


def test_no_check_without_lora_or_before_the_generator_had_an_adapter():
    assert not AdapterProbe(False).due(0, batch("between"), 0)
    assert not AdapterProbe(True).due(0, batch("between", version=0), 0)
    assert not AdapterProbe(True).due(0, batch("between", version=1), staleness=1)  # one step off: version 2


def test_rollouts_that_serve_the_base_model_are_refused():
    with pytest.raises(AdapterNotServedError, match="does not reach generation"):
        AdapterProbe(True).check(0, batch("base"), 0)


def test_a_batch_without_base_logprobs_is_not_checked():
    assert AdapterProbe(True).check(0, batch("base", ref=False), 0) == {}
