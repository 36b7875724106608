"""The rules about algorithm keys that only some advantage estimators read: set under an algorithm
whose estimator ignores it, a key is refused (each a named function of `rules.RULES`, registered by
`rules.rule`, with a violating example in tests/config/test_config.py)."""

from __future__ import annotations

from rlpost.config.rules import rule


def read_by(key: str, default, estimators: tuple[str, ...]) -> None:
    """A rule: `algo.<key>`, set, must be read by the algorithm's advantages (set under another, it was
    ignored without a word: the tenth catalogue's t54, t55)."""

    def check(cfg):
        from rlpost.algos.algorithms import ALGORITHMS

        value, estimator = getattr(cfg.algo, key), ALGORITHMS.get(cfg.algo.name).advantage
        if value != default and estimator not in estimators:  # (`default`: the knob's, which changes nothing)
            return (
                f"algo.{key}={value} is read only by the {' and '.join(estimators)} advantages; "
                f"algo.name={cfg.algo.name} takes {estimator}'s, which ignore it: leave algo.{key} out"
            )

    check.__name__ = f"{key}_read"
    rule(f"algo.{key}")(check)


for _args in (
    ("norm_adv_by_std", True, ("grpo", "rloo")),
    ("gamma", 1.0, ("reinforce_pp", "gae")),
    ("lam", 1.0, ("gae",)),
):
    read_by(*_args)


@rule("algo.clip_ratio_c")
def clip_c_read(cfg):
    """The dual clip bounds PPO's clipped loss for negative advantages; GSPO's sequence clip and CISPO's
    capped weight never read it (the nineteenth catalogue's t01b, t01c: accepted and ignored)."""
    from rlpost.algos.algorithms import ALGORITHMS

    loss = ALGORITHMS.get(cfg.algo.name).policy_loss
    if loss != "ppo" and cfg.algo.clip_ratio_c != 3.0:
        return (
            f"algo.clip_ratio_c={cfg.algo.clip_ratio_c:g} is read only by PPO's clipped loss; algo.name="
            f"{cfg.algo.name} takes the {loss} loss, which ignores it: leave algo.clip_ratio_c out"
        )


@rule("rollout.top_k")
def samples_can_differ(cfg):
    """`rollout.top_k=1` decodes greedily: a prompt's samples are one answer, so a group's advantages are
    all 0 (the nineteenth catalogue's t134: warned at every step, the reward blamed)."""
    from rlpost.algos.algorithms import ALGORITHMS
    from rlpost.config.rules import GROUP_ADVANTAGES

    advantage = ALGORITHMS.get(cfg.algo.name).advantage
    if cfg.rollout.top_k == 1 and advantage in GROUP_ADVANTAGES:
        return (
            f"rollout.top_k=1 keeps only the likeliest token: a prompt's rollout.n={cfg.rollout.n} samples are one "
            f"answer, so algo.name={cfg.algo.name}'s advantages (each sample against the others of its prompt) are "
            "all 0 and nothing trains; leave rollout.top_k out (0: off) or make it larger"
        )
