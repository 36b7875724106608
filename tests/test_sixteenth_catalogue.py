"""Faults the sixteenth bad-input catalogue found (tried by someone who did not write the code, on
2b9f08a onwards; /work's report, its index below): each test fails on the code before its fix."""

import json

import pytest

from rlpost.data.dataset import DataError, read_rows


def test_a_one_line_json_holding_the_rows_under_a_key_is_named_not_read_as_row_0(tmp_path):
    """t07: `json.dump({"data": rows}, f)` on one line was read as one row and refused as "row 0: field
    'prompt' is missing"; the same file pretty-printed was already named. A one-line row stays a row."""
    rows = [{"prompt": f"what is {i}?", "ground_truth": str(i)} for i in range(3)]
    path = tmp_path / "wrapped.json"
    path.write_text(json.dumps({"data": rows}))
    with pytest.raises(DataError) as info:
        read_rows(str(path))
    assert str(info.value) == (
        f"{path}: one JSON object (keys 'data'), not rows: a .json file holds one array of row objects, or one "
        "object a line; the rows look to be under 'data': write that list as the file"
    )
    path.write_text(json.dumps(rows[0]))
    assert read_rows(str(path)) == rows[:1]
    path.write_text(json.dumps({**rows[0], "tags": [{"a": 1}]}))  # a row that holds a list of objects
    assert read_rows(str(path)) == [{**rows[0], "tags": [{"a": 1}]}]
