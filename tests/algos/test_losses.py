import math

import pytest
import torch

from rlpost.algos.losses import aggregate, entropy_from_logits, kl_penalty, ppo_clip_loss


def test_ppo_clip_hand_computed():
    logp = torch.log(torch.tensor([[1.5, 0.5, 1.0, 5.0]]))
    old = torch.zeros(1, 4)
    adv = torch.tensor([[1.0, 1.0, -1.0, -1.0]])
    loss, ratio, clipped = ppo_clip_loss(logp, old, adv, 0.2, 0.2, 3.0)
    assert torch.allclose(ratio, torch.tensor([[1.5, 0.5, 1.0, 5.0]]))
    # A>0, r=1.5: max(-1.5, -1.2) = -1.2 (clipped); A>0, r=0.5: max(-0.5, -0.8) = -0.5
    # A<0, r=1: 1; A<0, r=5: max(5, 1.2) = 5, dual clip caps it at 3
    assert torch.allclose(loss, torch.tensor([[-1.2, -0.5, 1.0, 3.0]]))
    assert clipped.tolist() == [[True, False, False, False]]


def test_dual_clip_needs_c_above_one():
    with pytest.raises(ValueError, match="clip_ratio_c"):
        ppo_clip_loss(torch.zeros(1, 1), torch.zeros(1, 1), torch.ones(1, 1), 0.2, 0.2, 1.0)


def test_kl_estimators_hand_computed():
    logp, ref = torch.tensor([[0.0, -1.0]]), torch.tensor([[-1.0, 0.0]])
    # d = logp - ref = [1, -1]
    assert torch.allclose(kl_penalty(logp, ref, "k1"), torch.tensor([[1.0, -1.0]]))
    assert torch.allclose(kl_penalty(logp, ref, "k2"), torch.tensor([[0.5, 0.5]]))
    k3 = torch.tensor([[math.exp(-1) - 1 + 1, math.exp(1) - 1 - 1]])
    assert torch.allclose(kl_penalty(logp, ref, "k3"), k3)
    with pytest.raises(ValueError, match="k1"):
        kl_penalty(logp, ref, "k4")


def test_aggregation_modes():
    loss = torch.tensor([[1.0, 2.0, 3.0], [4.0, 0.0, 0.0]])
    mask = torch.tensor([[1, 1, 1], [1, 0, 0]])
    assert aggregate(loss, mask, "token-mean").item() == pytest.approx(10 / 4)
    # per sequence: mean(1,2,3) = 2, mean(4) = 4 -> 3
    assert aggregate(loss, mask, "seq-mean-token-mean").item() == pytest.approx(3.0)
    # a global denominator: micro-batches add up to the full-batch mean
    halves = [aggregate(loss[i : i + 1], mask[i : i + 1], "token-mean", denominator=4) for i in range(2)]
    assert sum(halves).item() == pytest.approx(10 / 4)
    with pytest.raises(ValueError, match="token-mean"):
        aggregate(loss, mask, "sum")


def test_entropy_of_uniform_and_peaked():
    uniform = torch.zeros(1, 1, 8)
    assert entropy_from_logits(uniform).item() == pytest.approx(math.log(8), rel=1e-6)
    peaked = torch.tensor([[[100.0, 0.0, 0.0]]])
    assert entropy_from_logits(peaked).item() == pytest.approx(0.0, abs=1e-6)


def test_truncated_is_weights_by_token_and_by_sequence():
    from rlpost.algos.losses import truncated_is_weights

    old = torch.log(torch.tensor([[0.5, 0.2, 0.9], [0.3, 0.6, 0.1]]))
    rollout = torch.log(torch.tensor([[0.25, 0.4, 0.1], [0.3, 0.2, 0.7]]))
    mask = torch.tensor([[1, 1, 1], [1, 1, 0]], dtype=torch.float32)
    w, cut = truncated_is_weights(old, rollout, mask, "token", 2.0)
    # ratios 2, 0.5, 9 -> capped at 2; 1, 3 -> 2; the padded token has log-weight 0 -> 1
    assert torch.allclose(w, torch.tensor([[2.0, 0.5, 2.0], [1.0, 2.0, 1.0]]), atol=1e-6)
    assert cut.tolist() == [[False, False, True], [False, True, False]]
    w, cut = truncated_is_weights(old, rollout, mask, "sequence", 5.0)
    # sequence products: 2 * 0.5 * 9 = 9 -> 5; 1 * 3 = 3 (the padded token does not count)
    assert torch.allclose(w, torch.tensor([[5.0] * 3, [3.0] * 3]), atol=1e-5)
    assert cut.tolist() == [[True] * 3, [False] * 3]
    assert not w.requires_grad
    w, cut = truncated_is_weights(old, rollout, mask, "token_mask", 2.5)
    assert w.dtype == old.dtype  # weights, not flags
    # ratios 2, 0.5, 9 | 1, 3: inside [0.4, 2.5] stay (weight 1), 9 and 3 leave; padding stays
    assert w.tolist() == [[1.0, 1.0, 0.0], [1.0, 0.0, 1.0]] and cut.tolist() == [
        [False, False, True],
        [False, True, False],
    ]
    w, _ = truncated_is_weights(old, rollout, mask, "token_mask", 1.9)  # two-sided: 0.5 < 1 / 1.9 leaves too
    assert w.tolist() == [[0.0, 0.0, 0.0], [1.0, 0.0, 1.0]]
    same = torch.zeros(1, 2)  # the band is closed: a ratio of exactly 1 stays at threshold 1
    assert truncated_is_weights(same, same, torch.ones(1, 2), "token_mask", 1.0)[0].tolist() == [[1.0, 1.0]]
    w, cut = truncated_is_weights(old, rollout, mask, "sequence_mask", 5.0)
    # sequence products 9 (outside [0.2, 5]: the whole sequence leaves) and 3 (stays)
    assert w.tolist() == [[0.0] * 3, [1.0] * 3] and cut.tolist() == [[True] * 3, [False] * 3]


@pytest.mark.parametrize("mode", ["token-mean", "seq-mean-token-mean", "seq-mean-token-sum-norm"])
def test_micro_batches_on_every_rank_add_up_to_the_mini_batch_loss(mode):
    """The cross-rank normalisation: each rank's micro-batch losses, each divided by the global
    count of the mini-batch (tokens, or sequences with a loss token), times world_size, then
    averaged over ranks as FSDP averages gradients, give exactly the loss of the whole mini-batch."""
    from types import SimpleNamespace

    from rlpost.algos.policy_loss import LossInputs, ppo_loss

    g = torch.Generator().manual_seed(0)
    rows, width, world = 10, 6, 2
    lengths = torch.randint(1, width + 1, (rows,), generator=g)
    mask = torch.arange(width) < lengths[:, None]
    loss_mask = mask & (torch.rand(rows, width, generator=g) > 0.2)
    loss_mask[3] = False  # a row without a single loss token
    logp = torch.randn(rows, width, generator=g) * mask
    old, ref = logp + 0.3 * torch.randn(rows, width, generator=g), logp + 0.2 * torch.randn(rows, width, generator=g)
    adv, entropy = torch.randn(rows, 1, generator=g), torch.rand(rows, width, generator=g)
    algo = SimpleNamespace(
        loss_agg_mode=mode,
        clip_ratio_low=0.2,
        clip_ratio_high=0.28,
        clip_ratio_c=3.0,
        rollout_is="none",
        kl_coef=0.1,
        kl_estimator="k3",
        entropy_coef=0.01,
    )

    def loss(idx, denominator):
        return ppo_loss(
            LossInputs(
                logp=logp[idx],
                old_logp=old[idx],
                advantages=adv[idx],
                entropy=entropy[idx],
                ref_logp=ref[idx],
                loss_mask=loss_mask[idx].float(),
                denominator=denominator,
                norm_length=width,
                kl_coef=algo.kl_coef,
            ),
            algo,
        ).loss

    count = loss_mask.sum() if mode == "token-mean" else (loss_mask.sum(-1) > 0).sum()
    full = loss(torch.arange(rows), float(count))
    ranks = [[torch.tensor([0, 5, 9]), torch.tensor([2])], [torch.tensor([1, 3]), torch.tensor([4, 6, 7, 8])]]
    per_rank = [sum(loss(micro, float(count)) for micro in rank) * world for rank in ranks]
    assert torch.allclose(sum(per_rank) / world, full, rtol=1e-6, atol=1e-7)
    one_rank = sum(loss(micro, float(loss_mask[torch.cat(ranks[0])].sum())) for micro in ranks[0])
    assert not torch.allclose(one_rank, full)  # a rank's own count would not do


def test_a_policy_loss_is_registered_once_under_its_name(monkeypatch):
    from rlpost.algos.policy_loss import POLICY_LOSSES

    first = POLICY_LOSSES["ppo"]
    with pytest.raises(ValueError, match=r"^policy loss 'ppo' is registered twice$"):
        POLICY_LOSSES.register("ppo", lambda x, algo: None)
    assert POLICY_LOSSES["ppo"] is first
    monkeypatch.setattr(POLICY_LOSSES, "_values", dict(POLICY_LOSSES._values))  # registrations undone afterwards

    def mine(x, algo):
        return None

    assert POLICY_LOSSES.register("_probe", mine) is mine and POLICY_LOSSES.get("_probe") is mine
    with pytest.raises(KeyError, match="_nope"):
        POLICY_LOSSES.get("_nope")


def test_ppo_loss_metrics_hand_computed():
    """Every metric of the ppo loss, from scratch over the tokens of the loss mask (a hole in row
    0, padding in row 1): the policy-gradient loss, clip fraction, entropy, ratio extremes, the
    TIS weights (mean, max, truncated fraction) and the rollout/trainer k3 KL."""
    from rlpost.algos.policy_loss import LossInputs, ppo_loss
    from rlpost.config import load_config

    algo = load_config(
        ["+recipe=quickstart", "algo.rollout_is=token", "algo.rollout_is_threshold=1.5", "algo.kl_coef=0"]
    ).algo
    d = torch.float64
    logp = torch.tensor([[-1.0, -0.5, -2.0], [-0.2, -1.5, -9.0]], dtype=d)
    old = torch.tensor([[-1.3, -2.0, -2.0], [-0.2, -1.0, 5.0]], dtype=d)
    rollout = torch.tensor([[-1.9, -0.3, -7.0], [-0.1, -1.0, -3.0]], dtype=d)
    adv = torch.tensor([[1.0], [-2.0]], dtype=d)
    mask = torch.tensor([[1.0, 1.0, 0.0], [1.0, 1.0, 0.0]], dtype=d)
    mask[0, 1] = 0.0  # a hole
    entropy = torch.tensor([[0.5, 3.0, 9.0], [1.5, 2.5, 9.0]], dtype=d)
    out = ppo_loss(LossInputs(logp, old, adv, mask, 3.0, 4, entropy, None, rollout), algo)
    m = mask.bool()
    ratio = torch.exp(logp - old)
    unclipped, clipped = -adv * ratio, -adv * ratio.clamp(1 - algo.clip_ratio_low, 1 + algo.clip_ratio_high)
    pg = torch.maximum(unclipped, clipped)
    pg = torch.where(adv < 0, torch.minimum(pg, -adv * algo.clip_ratio_c), pg)
    w = torch.exp(old - rollout).clamp(max=1.5)
    d_r = rollout - old
    expected = {
        "actor/pg_loss": (pg * w)[m].mean(),
        "actor/pg_clipfrac": (clipped > unclipped)[m].double().mean(),
        "actor/entropy": entropy[m].mean(),
        "rollout_corr/is_weight_mean": w[m].mean(),
        "rollout_corr/truncated_frac": (torch.exp(old - rollout) > 1.5)[m].double().mean(),
        "rollout_corr/kl": (torch.exp(-d_r) - 1 + d_r)[m].mean(),
    }
    assert set(out.means) == set(expected)
    for key, value in expected.items():
        total, count = out.means[key]
        assert count == 3 and math.isclose(float(total / count), float(value), rel_tol=1e-12), key
    assert set(out.maxes) == {"actor/ppo_ratio_max", "rollout_corr/is_weight_max"} and set(out.mins) == {
        "actor/ppo_ratio_min"
    }
    assert float(out.maxes["actor/ppo_ratio_max"]) == float(ratio[m].max())
    assert float(out.mins["actor/ppo_ratio_min"]) == float(ratio[m].min())
    assert float(out.maxes["rollout_corr/is_weight_max"]) == float(w[m].max())
    assert 0 < float(expected["actor/pg_clipfrac"]) < 1 and 0 < float(expected["rollout_corr/truncated_frac"]) < 1
    # the masked-out tokens would change both extremes
    assert float(ratio[m].max()) < float(ratio.max()) and float(ratio[m].min()) > float(ratio.min())
    no_entropy = ppo_loss(LossInputs(logp, old, adv, mask, 3.0, 4, None, None, rollout), algo)
    assert "actor/entropy" not in no_entropy.means


def test_k3_is_clamped_at_twenty_both_ways():
    d = torch.tensor([-25.0, 25.0, 3.0], dtype=torch.float64)
    got = kl_penalty(d, torch.zeros(3, dtype=torch.float64), "k3")
    clamped = d.clamp(-20.0, 20.0)
    assert torch.equal(got, torch.exp(-clamped) - 1.0 + d)
    assert got[0] != torch.exp(-d[0]) - 1.0 + d[0] and got[1] != torch.exp(-d[1]) - 1.0 + d[1]


def test_an_unknown_tis_mode_is_named():
    from rlpost.algos.losses import truncated_is_weights

    x = torch.zeros(1, 2)
    with pytest.raises(
        ValueError, match=r"^algo.rollout_is='tokens'; choose none, token, sequence, token_mask or sequence_mask$"
    ):
        truncated_is_weights(x, x, x, "tokens", 2.0)


def test_sequence_log_ratio_is_the_mean_over_loss_tokens():
    from rlpost.algos.losses import sequence_log_ratio

    logp = torch.tensor([[-1.0, -2.0, -3.0], [-1.0, -1.0, -1.0], [0.0, 0.0, 0.0]])
    old = torch.tensor([[-1.5, -1.0, -9.0], [-3.0, 0.0, 0.0], [-1.0, -1.0, -1.0]])
    mask = torch.tensor([[1, 1, 0], [1, 0, 0], [0, 0, 0]], dtype=torch.bool)  # a bool mask works too
    out = sequence_log_ratio(logp, old, mask)
    assert out.shape == (3, 1)
    assert out[:, 0].tolist() == [(0.5 - 1.0) / 2, 2.0, 0.0]  # one token: its own log-ratio; none: 0


def sequence_loss_inputs():
    """Two sequences of three loss tokens (one hole) whose geometric-mean ratios are 1.1 (inside a
    (0.8, 1.2) clip) and 1.5 (outside), with positive and negative advantages."""
    from rlpost.algos.policy_loss import LossInputs

    d = torch.float64
    old = torch.tensor([[-1.0, -2.0, -0.5], [-1.0, -1.0, -1.0]], dtype=d)
    shift = torch.tensor([[math.log(1.1) + 0.3, 5.0, math.log(1.1) - 0.3], [math.log(1.5)] * 3], dtype=d)
    mask = torch.tensor([[1.0, 0.0, 1.0], [1.0, 1.0, 1.0]], dtype=d)
    logp = (old + shift).requires_grad_(True)
    adv = torch.tensor([[2.0], [-1.0]], dtype=d)
    return LossInputs(logp, old, adv, mask, 2.0, 3), logp


def test_gspo_loss_and_metrics_hand_computed():
    from rlpost.algos.policy_loss import gspo_loss
    from rlpost.config import load_config

    algo = load_config(
        ["+recipe=gspo", "algo.clip_ratio_low=0.2", "algo.clip_ratio_high=0.2", "algo.rollout_is=none"]
    ).algo
    x, logp = sequence_loss_inputs()
    out = gspo_loss(x, algo)
    # seq-mean-token-mean: row 0, s = 1.1 inside the range: -2 * 1.1; row 1, s = 1.5 and A < 0:
    # max(1.5, 1.2) = 1.5 (the unclipped term is the larger: no clip)
    assert math.isclose(float(out.loss), (-2 * 1.1 + 1.5) / 2, rel_tol=1e-9)
    total, count = out.means["actor/pg_clipfrac"]
    assert float(total) == 0 and float(count) == 5
    assert math.isclose(float(out.maxes["actor/ppo_ratio_max"]), 1.5, rel_tol=1e-9)
    assert math.isclose(float(out.mins["actor/ppo_ratio_min"]), 1.1, rel_tol=1e-9)
    out.loss.backward()
    # d/dlogp_t: row 0: -A s / |y| on each loss token; row 1: -A s / |y| too; 1/2 for the two rows
    expected = torch.tensor([[-2 * 1.1 / 2, 0.0, -2 * 1.1 / 2], [1.5 / 3] * 3], dtype=torch.float64) / 2
    assert torch.allclose(logp.grad, expected, atol=1e-12)
    # flip the advantages: row 0 still inside; row 1 (A > 0, s = 1.5) is clipped at 1.2: no gradient
    x.advantages = -x.advantages
    out = gspo_loss(x, algo)
    assert math.isclose(float(out.loss), (2 * 1.1 - 1.2) / 2, rel_tol=1e-9)
    total, count = out.means["actor/pg_clipfrac"]
    assert float(total) == 3 and float(count) == 5


def test_cispo_loss_and_metrics_hand_computed():
    from rlpost.algos.policy_loss import cispo_loss
    from rlpost.config import load_config

    algo = load_config(["+recipe=cispo", "algo.clip_ratio_high=0.3", "algo.rollout_is=none", "algo.kl_coef=0"]).algo
    x, logp = sequence_loss_inputs()
    out = cispo_loss(x, algo)
    ratio = torch.exp(logp.detach() - x.old_logp)
    weight = ratio.clamp(max=1.3)
    m = x.loss_mask.bool()
    per_token = -x.advantages * weight * logp.detach()
    assert math.isclose(float(out.loss), float(per_token[m].sum() / 2.0), rel_tol=1e-9)  # token-mean, denom 2
    total, count = out.means["actor/pg_clipfrac"]
    assert float(total) == float((ratio > 1.3)[m].sum()) == 4 and float(count) == 5  # row 0's first token too
    out.loss.backward()
    # the weight carries no gradient: d/dlogp = -A w / denominator
    assert torch.allclose(logp.grad, (-x.advantages * weight * x.loss_mask) / 2.0, atol=1e-12)


def test_aggregation_edges():
    """A denominator of one, an empty row without a global denominator, the Dr.GRPO constant."""
    loss = torch.tensor([[1.0, 2.0, 3.0], [4.0, 0.0, 0.0], [7.0, 7.0, 7.0]])
    mask = torch.tensor([[1, 1, 1], [1, 0, 0], [0, 0, 0]])  # the last row has no token
    for denom in (1.0, torch.tensor(1.0, dtype=torch.float64)):
        assert aggregate(loss[1:2], mask[1:2], "token-mean", denominator=denom).item() == 4.0
        assert aggregate(loss[1:2], mask[1:2], "seq-mean-token-mean", denominator=denom).item() == 4.0
    assert aggregate(loss, mask, "seq-mean-token-mean").item() == pytest.approx(3.0)  # 2 rows, not 3
    assert aggregate(loss, mask, "seq-mean-token-sum-norm", norm_length=1).item() == pytest.approx((6 + 4) / 2)
    assert aggregate(loss, mask, "seq-mean-token-sum-norm", norm_length=4).item() == pytest.approx((1.5 + 1) / 2)
    with pytest.raises(ValueError, match=r"^loss aggregation seq-mean-token-sum-norm needs norm_length >= 1"):
        aggregate(loss, mask, "seq-mean-token-sum-norm")  # no generation budget given
