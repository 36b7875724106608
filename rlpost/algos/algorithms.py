"""Algorithms as declarations: what an RL algorithm is made of, one entry each, no loop code.

An `Algorithm` names its advantage estimator (`rlpost.algos.advantages`), its policy loss
(`rlpost.algos.policy_loss`), where the KL to the reference policy goes, an optional batch filter
(`rlpost.algos.filters`) and the roles it needs beyond `actor` and `rollout`. The controller
composes its step from these (`rlpost.controller.loop`): adding an algorithm touches this file, a
recipe and tests, never the loop. The knobs' values (clip ranges, coefficients) live in the
recipe (`recipes/<name>.yaml`); `docs/algorithms.md` gives the equations and papers.

KL placement (`kl`), when `algo.kl_coef > 0`:
- `loss`: a term `kl_coef * KL(pi || pi_ref)` of the policy loss, by `algo.kl_estimator`
  (GRPO, Shao et al. 2024).
- `reward`: a per-token penalty `-kl_coef * KL_t` added to the reward before advantages are
  computed (Ziegler et al. 2019; REINFORCE++): the reference log-probs must exist before the
  advantages, so the log-probs come from a separate pass, not from the update's forward.
"""

from __future__ import annotations

from dataclasses import dataclass

from rlpost.algos.advantages import TOKEN_REWARDS
from rlpost.registry import Registry

KL_PLACEMENTS = ("loss", "reward")
ROLES = ("actor", "rollout", "reference", "critic", "reward_model")


@dataclass(frozen=True)
class Algorithm:
    name: str
    paper: str
    advantage: str  # a key of rlpost.algos.advantages.ADVANTAGES
    policy_loss: str  # a key of rlpost.algos.policy_loss.POLICY_LOSSES
    kl: str = "loss"  # where algo.kl_coef applies: KL_PLACEMENTS
    batch_filter: str = "none"  # a key of rlpost.algos.filters.BATCH_FILTERS
    roles: tuple[str, ...] = ()  # roles it always needs beyond actor and rollout


ALGORITHMS: Registry[Algorithm] = Registry("algorithm", key="algo.name")


def register_algorithm(algo: Algorithm) -> Algorithm:
    """Check the declaration, then register it under its name."""
    if algo.kl not in KL_PLACEMENTS:
        raise ValueError(f"algorithm {algo.name!r}: kl={algo.kl!r}; choose one of {KL_PLACEMENTS}")
    if algo.kl == "reward" and algo.advantage not in TOKEN_REWARDS:
        raise ValueError(
            f"algorithm {algo.name!r} puts the KL in the reward, but its estimator {algo.advantage!r} "
            "reads no per-token rewards"
        )
    unknown = set(algo.roles) - set(ROLES)
    if unknown:
        raise ValueError(f"algorithm {algo.name!r} names unknown roles {sorted(unknown)}; roles are {ROLES}")
    return ALGORITHMS.register(algo.name, algo)


def needed_roles(algo: Algorithm, kl_coef: float, reward_model: bool) -> tuple[str, ...]:
    """The roles a run of `algo` starts, in ROLES order: `reference` only with a KL term,
    `reward_model` only when a reward model is configured; never one it does not need."""
    need = {"actor", "rollout", *algo.roles}
    if kl_coef > 0:
        need.add("reference")
    if reward_model:
        need.add("reward_model")
    return tuple(r for r in ROLES if r in need)


register_algorithm(Algorithm("grpo", "Shao et al. 2024 (DeepSeekMath)", advantage="grpo", policy_loss="ppo"))
register_algorithm(
    Algorithm(
        "ppo",
        "Schulman et al. 2017; Ouyang et al. 2022",
        advantage="gae",
        policy_loss="ppo",
        kl="reward",
        roles=("critic",),
    )
)
register_algorithm(Algorithm("rloo", "Ahmadian et al. 2024", advantage="rloo", policy_loss="ppo"))
register_algorithm(
    Algorithm("reinforce_pp", "Hu 2025 (REINFORCE++)", advantage="reinforce_pp", policy_loss="ppo", kl="reward")
)
register_algorithm(
    Algorithm("reinforce_pp_baseline", "Hu 2025 (REINFORCE++)", advantage="reinforce_pp_baseline", policy_loss="ppo")
)
register_algorithm(
    Algorithm("dapo", "Yu et al. 2025 (DAPO)", advantage="grpo", policy_loss="ppo", batch_filter="dynamic_sampling")
)
register_algorithm(Algorithm("gspo", "Zheng et al. 2025 (GSPO)", advantage="grpo", policy_loss="gspo"))
register_algorithm(Algorithm("cispo", "MiniMax 2025 (MiniMax-M1)", advantage="grpo", policy_loss="cispo"))
