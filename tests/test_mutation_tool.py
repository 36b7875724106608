"""benchmarks/mutation/mutation.py: which survivors only reword a message (`text_only`), and the
two scores, with and without them."""

from __future__ import annotations

from collections import Counter

import pytest

from tests.helpers import load_benchmark


def diff(old: str, new: str) -> str:
    """A survivor's diff as `mutmut show` prints it: a header, a hunk, context around the change."""
    return "\n".join(
        [
            "# rlpost.m.x_f__mutmut_1: survived",
            "--- rlpost/m.py",
            "+++ rlpost/m.py",
            "@@ -1,3 +1,3 @@",
            "     out = {}",
            *(f"-{line}" for line in old.splitlines()),
            *(f"+{line}" for line in new.splitlines()),
            "     return out",
        ]
    )


WORDING = [
    ('        "tokens without ending: raise it"', '        "XXtokens without ending: raise itXX"'),
    ('        "tokens without ending: raise it"', '        "TOKENS WITHOUT ENDING: RAISE IT"'),
    (
        '                    "trainer.optim.offload=layerwise)"',
        '                    "TRAINER.OPTIM.OFFLOAD=LAYERWISE)"',
    ),
    ('    return "\\n".join(lines)', '    return "XX\\nXX".join(lines)'),
    ('    log(f"merging {adapter} into {base}")', '    log(f"XXmerging {adapter} into {base}XX")'),
    ('    x = f"a {b!r} c"  # note', '    x = f"A {b!r} C"  # note'),
]
BEHAVIOUR = [
    ('    val = metrics.get("val/accuracy")', '    val = metrics.get("XXval/accuracyXX")'),  # a key
    ('    torch.save(s, tmp / "controller.pt")', '    torch.save(s, tmp / "CONTROLLER.PT")'),  # a file name
    ('    x = float("nan")', '    x = float("NAN")'),  # a name (equivalent here: a note says so)
    ('    log(f"step {step + 1} done")', '    log(f"step {step - 1} done")'),  # an f-string's expression
    ("    log(f\"a {x if x else 'none'}\")", "    log(f\"a {x if x else 'NONE'}\")"),  # inside an expression
    ('    if kind != "a b" and peak > room:', '    if kind != "a b" and peak >= room:'),  # an operator
    ('    log("a b", 1)', '    log("a b", 2)'),  # a number beside a message
    ('    log("a b")', '    log(b"a b")'),  # bytes for text
    ('    log("a b")', "    log(None)"),  # the message dropped
    ('    raise ValueError(\n        "x y"\n    )', "    raise ValueError(\n    )"),  # a line dropped
]


@pytest.mark.parametrize("old, new", WORDING)
def test_a_reworded_message_is_text_only(old, new):
    assert load_benchmark("benchmarks/mutation/mutation.py").text_only(diff(old, new))


@pytest.mark.parametrize("old, new", BEHAVIOUR)
def test_a_changed_key_name_expression_or_value_is_behaviour(old, new):
    assert not load_benchmark("benchmarks/mutation/mutation.py").text_only(diff(old, new))


def test_the_score_counts_text_only_survivors_and_the_behaviour_score_leaves_them_out():
    """80 killed + 4 timeouts caught, of 100 tested with 10 text-only: 84/100 and 84/90; the
    equivalent and the unchecked count in neither."""
    counts = Counter(killed=80, timeout=4, survived=5, text_only=10, no_tests=1, equivalent=3, not_checked=7)
    out = load_benchmark("benchmarks/mutation/mutation.py").scores(counts)
    assert out == {"killed": 80, "survived": 5, "text_only": 10, "timeout": 4, "equivalent": 3, "no_tests": 1,
                   "not_checked": 7, "score": 0.84, "score_behaviour": 0.9333}  # fmt: skip
    nothing = load_benchmark("benchmarks/mutation/mutation.py").scores(Counter(not_checked=3))
    assert nothing["score"] is None and nothing["score_behaviour"] is None
