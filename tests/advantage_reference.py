"""Advantages written from their papers' definitions, one row and one token at a time, for the
actor update's reference (tests/roles/test_update_reference.py): GRPO's group-normalised
advantage, REINFORCE++ (discounted returns of per-token KL rewards, normalised over the batch)
and REINFORCE++ with the group mean as baseline."""

import torch


def grpo_advantages(rewards, groups, norm_by_std=True):
    adv = torch.zeros_like(rewards)
    for gid in groups.unique():
        idx = groups == gid
        r = rewards[idx].double()
        a = r - r.mean()
        adv[idx] = (a / (r.std() + 1e-6) if norm_by_std else a).float()
    return adv


def k_estimate(d, estimator):
    """Schulman's estimators of KL(p || q) from d = log p - log q."""
    return {"k1": d, "k2": d**2 / 2, "k3": torch.exp(-d) - 1 + d}[estimator]


def reference_advantages(batch, rewards, algo: dict):
    """Per row, the advantage of each of its own tokens (the tokens of `loss_mask`), for the whole
    batch at once: REINFORCE++ normalises over every token of the batch."""
    own = [batch["loss_mask"][i][batch["response_mask"][i]] for i in range(len(batch))]
    if algo["name"] == "reinforce_pp":  # returns of per-token rewards: -kl_coef * KL_t, the reward last
        per_row = []
        for i in range(len(batch)):
            m = batch["response_mask"][i]
            d = (batch["old_logprobs"][i][m] - batch["ref_logprobs"][i][m])[own[i]].double()
            r = -algo["kl_coef"] * k_estimate(d, algo["kl_estimator"])
            if len(r):
                r[-1] += rewards[i]
            returns, g = [], 0.0
            for t in reversed(range(len(r))):
                g = r[t] + algo["gamma"] * g
                returns.insert(0, g)
            per_row.append(torch.tensor(returns, dtype=torch.float64))
    elif algo["name"] == "reinforce_pp_baseline":  # the group mean as baseline, on every token
        centred = grpo_advantages(rewards, batch["group_ids"], norm_by_std=False)
        per_row = [torch.full((int(own[i].sum()),), float(centred[i]), dtype=torch.float64) for i in range(len(batch))]
    else:
        adv = grpo_advantages(rewards, batch["group_ids"], algo["norm_adv_by_std"])
        return [torch.full((int(own[i].sum()),), float(adv[i])) for i in range(len(batch))]
    every = torch.cat(per_row)
    return [((a - every.mean()) / (every.std() + 1e-6)).float() for a in per_row]
