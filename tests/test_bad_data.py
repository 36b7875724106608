"""Data files as users write them (the second catalogue of bad inputs, issue 39): a JSON array in
a `.json` file, a CSV file, a byte-order mark, a format rlpost does not read, and own data
without validation rows. Each is read, or refused before any actor starts, naming the file or
key and what to do."""

from __future__ import annotations

import json

import pytest

from rlpost.config import ConfigError, load_config
from rlpost.controller.setup import check_row_counts, load_data
from rlpost.data.dataset import DataError, load_prompts, read_rows
from rlpost.tiny.model import build_char_tokenizer

OWN = ["+recipe=quickstart", "data.task=", "data.train_files=[t.jsonl]", "data.train_batch_size=4"]
ROWS = [{"prompt": "1+2=", "ground_truth": "3"}, {"prompt": "4+4=", "ground_truth": "8", "data_source": "arithmetic"}]


def test_a_json_file_holding_one_array_is_read_as_its_rows(tmp_path):
    path = tmp_path / "rows.json"
    path.write_text(json.dumps(ROWS, indent=2))  # pretty-printed: many lines a row
    assert read_rows(str(path)) == ROWS
    path.write_text(json.dumps(ROWS, indent=2)[:-1])  # the closing bracket lost
    with pytest.raises(DataError, match=r"rows.json: not valid JSON \(Expecting ',' delimiter, line \d+\)$"):
        read_rows(str(path))


def test_a_csv_file_with_a_header_is_read_and_checked(tmp_path):
    path = tmp_path / "rows.csv"
    path.write_text('prompt,ground_truth\n1+2=,3\n"say ""hi"", then 4+4=",8\n')
    loaded = load_prompts([str(path)], build_char_tokenizer(), 64, "arithmetic")
    assert [(r.prompt_text, r.ground_truth, r.data_source) for r in loaded.rows] == [
        ("1+2=", "3", "arithmetic"),
        ('say "hi", then 4+4=', "8", "arithmetic"),
    ]
    path.write_text("question,answer\n1+2=,3\n")
    with pytest.raises(DataError, match=r"rows.csv: row 0: field 'prompt' is missing \(fields present: \['answer'"):
        load_prompts([str(path)], build_char_tokenizer(), 64)


def test_a_byte_order_mark_is_left_out(tmp_path):
    path = tmp_path / "rows.jsonl"
    path.write_bytes(b"\xef\xbb\xbf" + "".join(json.dumps(r) + "\n" for r in ROWS).encode())
    assert read_rows(str(path)) == ROWS


@pytest.mark.parametrize("name", ["rows.txt", "rows.xlsx", "rows"])
def test_a_file_in_a_format_rlpost_does_not_read_is_named_with_the_formats_it_does(tmp_path, name):
    path = tmp_path / name
    path.write_text("1+2=\t3\n")
    with pytest.raises(DataError, match=rf"{name}: rlpost does not read .* files; give rows as \.jsonl .*\.csv"):
        read_rows(str(path))  # not sent to the hub as a data set's name


def test_own_data_without_validation_rows_is_refused_before_the_actors_naming_both_ways_out(tmp_path):
    train = tmp_path / "t.jsonl"
    train.write_text("".join(json.dumps(ROWS[i % 2]) + "\n" for i in range(8)))
    cfg = load_config(OWN)
    with pytest.raises(DataError) as info:  # what the controller loads before any actor starts
        load_data(load_config([*OWN, f"data.train_files=[{train}]"]), build_char_tokenizer(), log=lambda *_: None)
    assert str(info.value) == (  # (the message the same from every caller)
        "data.val_files=[] gave no validation prompts, which trainer.val_every=10 need: give "
        "data.val_files=[FILE] (held-out rows in the training rows' format), or set trainer.val_every=0 "
        "to train without them"
    )
    both = load_config([*OWN, "trainer.start_pass_k=8"])
    with pytest.raises(DataError, match=r"which trainer.val_every=10 and trainer.start_pass_k=8 need: .* or set "
                       r"trainer.val_every=0 trainer.start_pass_k=0 to train"):  # fmt: skip
        check_row_counts(both, ["t.jsonl"], 200, [], 0)
    check_row_counts(load_config([*OWN, "trainer.val_every=0"]), ["t.jsonl"], 200, [], 0)  # none needed: it trains
    with pytest.raises(DataError, match=r"^data.train_files=\['e.jsonl'\] gave 0 training prompts .* fewer than"):
        check_row_counts(cfg, ["e.jsonl"], 0, ["v.jsonl"], 64, train_dropped=3)  # every prompt too long
    with pytest.raises(DataError, match=r"^data.train_files=\['e.jsonl'\] holds no rows \(empty\): give the train"):
        check_row_counts(cfg, ["e.jsonl"], 0, ["v.jsonl"], 64)


def test_a_folder_that_is_no_saved_data_set_is_named_with_the_files_it_holds(tmp_path):
    (tmp_path / "rows").mkdir()
    (tmp_path / "rows" / "train.jsonl").write_text(json.dumps(ROWS[0]) + "\n")
    with pytest.raises(DataError, match=r"rows: a folder that datasets.save_to_disk did not write .*\['train.jsonl'\]"):
        read_rows(str(tmp_path / "rows"))  # not the datasets library's own message


@pytest.mark.parametrize("answer", ["", "  "])
def test_an_empty_ground_truth_is_refused_where_rlposts_scorer_compares_with_it(tmp_path, answer):
    path = tmp_path / "rows.jsonl"
    path.write_text(json.dumps(ROWS[0]) + "\n" + json.dumps({"prompt": "2+2=", "ground_truth": answer}) + "\n")
    tok = build_char_tokenizer()
    with pytest.raises(DataError, match=r"rows.jsonl: row 1: field 'ground_truth' is empty, and reward 'arithmetic' "):
        load_prompts([str(path)], tok, 64, "arithmetic", scorer=lambda source: source)
    loaded = load_prompts([str(path)], tok, 64, "arithmetic", scorer=lambda source: None)  # the user's function
    assert [r.ground_truth for r in loaded.rows] == ["3", answer]


@pytest.mark.parametrize(
    "body, says",
    [
        ("    raise RuntimeError('no sandbox here')", r"making the environment of the first training row raised "
         r"RuntimeError: no sandbox here$"),
        ("    return None", r"the factory returned NoneType, not an environment \(an object with a step\(turn\)"),
    ],
)  # fmt: skip
def test_an_environment_that_cannot_be_made_stops_the_run_before_the_actors(tmp_path, body, says):
    train = tmp_path / "t.jsonl"
    train.write_text("".join(json.dumps(ROWS[1]) + "\n" for _ in range(4)))
    env = tmp_path / "my_env.py"
    env.write_text(f"def make(row, options):\n{body}\n")
    cfg = load_config([*OWN, f"data.train_files=[{train}]", f"data.val_files=[{train}]", f"env.name={env}:make"])
    with pytest.raises(ConfigError, match=rf"^env.name='{env}:make': {says}"):
        load_data(cfg, build_char_tokenizer(), log=lambda *_: None)


def test_an_empty_training_file_is_said_to_be_empty(tmp_path):
    train, val = tmp_path / "t.jsonl", tmp_path / "v.jsonl"
    train.write_text("")
    val.write_text("\n".join(json.dumps(r) for r in ROWS) + "\n")
    cfg = load_config([*OWN, f"data.train_files=[{train}]", f"data.val_files=[{val}]"])
    with pytest.raises(DataError, match=rf"^data.train_files=\['{train}'\] holds no rows \(empty\)"):
        load_data(cfg, build_char_tokenizer(), log=lambda *_: None)
