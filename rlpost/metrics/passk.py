"""pass@k: the chance that at least one of k samples is correct.

Estimated without bias from n >= k samples per problem of which c are correct (Chen et al. 2021,
"Evaluating Large Language Models Trained on Code"): pass@k = 1 - C(n - c, k) / C(n, k), averaged
over problems. pass@1 is the mean per-sample accuracy. A start model whose pass@k (k = the GRPO
group size) is well above its pass@1 gives RL groups with both right and wrong answers to learn
from (docs/learnable-start.md).
"""

from __future__ import annotations

from math import comb


def pass_at_k(n: int, c: int, k: int) -> float:
    """Unbiased pass@k of one problem with `c` correct among `n` samples."""
    if not 0 <= c <= n or not 1 <= k <= n:
        raise ValueError(f"pass@k needs 0 <= c <= n and 1 <= k <= n, got n={n}, c={c}, k={k}")
    return 1.0 - comb(n - c, k) / comb(n, k)


def pass_at_ks(correct: list[list[bool]], ks: list[int]) -> dict[str, float]:
    """`{"pass@k": mean over problems}` for each k, from per-problem lists of sample verdicts."""
    out = {}
    for k in ks:
        out[f"pass@{k}"] = sum(pass_at_k(len(c), sum(c), k) for c in correct) / max(len(correct), 1)
    return out
