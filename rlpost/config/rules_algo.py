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
