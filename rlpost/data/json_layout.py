"""What a `.json` data file's text is laid out as, when it is not rows: pure checks the loader
(`rlpost/data/dataset.py`) turns into errors that name the file."""

from __future__ import annotations

import json
from collections import Counter
from decimal import Decimal


def not_rows(text: str, one_line: bool) -> str | None:
    """What is wrong with a .json whose text is one JSON object as a whole, or None: the rows under
    a key, pretty-printed (the fourteenth catalogue's t19) or on one line (the sixteenth's t07), are
    named, not read as "row 0". One line holding a single object with no list of rows in it is a
    file of one row."""
    try:
        data = json.loads(text)
    except json.JSONDecodeError:
        return None  # JSON lines, or a JSON error the line reader names by row
    if not isinstance(data, dict):
        return None
    lists = [k for k, v in data.items() if isinstance(v, list) and v and all(isinstance(x, dict) for x in v)]
    if one_line and (not lists or "prompt" in data):
        return None
    hint = f"; the rows look to be under {lists[0]!r}: write that list as the file" if lists else ""
    keys = ", ".join(map(repr, list(data)[:5]))
    return (
        f"one JSON object (keys {keys}), not rows: a .json file holds one array of row objects, or one object "
        f"a line{hint}"
    )


def one_value_a_key(pairs: list) -> dict:
    """A JSON object whose keys are each given once: json keeps the last of a key given twice,
    without a word (the ninth catalogue's n12: a ground truth given twice, the wrong one kept). Read
    with `parse_float=Decimal`, its decimals are floats again but a ground truth's, which keeps the
    digits as written (`dataset.number_text`)."""
    out = {k: v if k == "ground_truth" else _floats(v) for k, v in pairs}
    if len(out) < len(pairs):
        raise KeyError(next(k for k, n in Counter(k for k, _ in pairs).items() if n > 1))
    return out


def columns_layout(text: str) -> bool:
    """Whether `text` is one JSON object whose values are all objects or arrays (a column each)."""
    try:
        whole = json.loads(text)
    except ValueError:
        return False
    values = list(whole.values()) if isinstance(whole, dict) else []
    return bool(values) and all(isinstance(v, (dict, list)) for v in values) and "prompt" in whole


def _floats(value):
    """A JSON value with its Decimals (parse_float) as floats, in lists too (objects are their own hook's)."""
    if isinstance(value, Decimal):
        return float(value)
    return [_floats(v) for v in value] if isinstance(value, list) else value
