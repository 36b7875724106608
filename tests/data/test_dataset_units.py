"""data/dataset.py one piece at a time: the messages a bad row or file gets, where reading a file
stops, how prompts are counted in tokens, a hub id's split, and the loader's epochs."""

from __future__ import annotations

import json
from types import SimpleNamespace

import pytest

from rlpost.data.dataset import DataError, PromptLoader, check_row, load_prompts, read_rows
from rlpost.tiny.model import build_char_tokenizer


def write_rows(path, rows: list[dict]) -> str:
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return str(path)


@pytest.mark.parametrize(
    "row, says",
    [
        (["1+1=", "2"], "expected an object with 'prompt' and 'ground_truth', got list"),
        ({"prompt": 12, "ground_truth": "2"}, "field 'prompt' must be a string or a list of chat messages, got int"),
        ({"prompt": "1+1=", "ground_truth": ["2"]}, "field 'ground_truth' must be a string or number, got list"),
        ({"prompt": "1+1=", "ground_truth": "2", "data_source": 7}, "field 'data_source' must be a string, got int"),
    ],
)
def test_a_field_of_the_wrong_type_is_named_with_the_type_it_has(row, says):
    with pytest.raises(DataError) as info:
        check_row(row, "rows.jsonl: row 3")
    assert str(info.value) == f"rows.jsonl: row 3: {says}"


def test_a_jsonl_line_that_is_an_array_is_a_row_of_the_wrong_type_not_a_json_array_file(tmp_path):
    path = tmp_path / "rows.jsonl"
    path.write_text('["1+1=", "2"]\n["2+2=", "4"]\n')
    assert read_rows(str(path)) == [["1+1=", "2"], ["2+2=", "4"]]
    with pytest.raises(DataError, match=r"rows.jsonl: row 0: expected an object with 'prompt' and 'ground_truth', "):
        load_prompts([str(path)], build_char_tokenizer(), 64)


def test_a_json_array_after_blank_space_and_jsonl_with_blank_lines_are_read_whole(tmp_path):
    rows = [{"prompt": "1+1=", "ground_truth": "2"}, {"prompt": "2+2=", "ground_truth": "4"}]
    array = tmp_path / "rows.json"
    array.write_text("\n  " + json.dumps(rows) + "\n")
    assert read_rows(str(array)) == rows
    lines = tmp_path / "rows.jsonl"
    lines.write_text(json.dumps(rows[0]) + "\n\n   \n" + json.dumps(rows[1]) + "\n")
    assert read_rows(str(lines)) == rows


def test_rows_without_a_data_source_and_no_default_have_none(tmp_path):
    path = write_rows(tmp_path / "rows.jsonl", [{"prompt": "1+1=", "ground_truth": "2"}])
    assert [r.data_source for r in load_prompts([path], build_char_tokenizer(), 64).rows] == [""]


def test_an_empty_answer_rlposts_scorer_would_compare_with_is_refused_in_full(tmp_path):
    path = write_rows(tmp_path / "rows.jsonl", [{"prompt": "1+1=", "ground_truth": ""}])
    with pytest.raises(DataError) as info:
        load_prompts([path], build_char_tokenizer(), 64, "arithmetic", scorer=lambda source: source)
    assert str(info.value) == (
        f"{path}: row 0: field 'ground_truth' is empty, and reward 'arithmetic' scores answers against it: give the "
        "row its answer, or leave the row out"
    )


class BareTokenizer:
    """A tokenizer with neither `chat_template` nor `name_or_path`: one character a token."""

    def __call__(self, text, add_special_tokens=True):
        return SimpleNamespace(input_ids=[ord(c) for c in text])


def untemplated():
    tok = build_char_tokenizer()
    tok.chat_template = None
    assert tok.name_or_path == ""
    return tok


@pytest.mark.parametrize(
    "tokenizer, named",
    [
        (BareTokenizer(), "model.path"),
        (untemplated(), "model.path"),  # a name_or_path of ""
        (SimpleNamespace(chat_template=None, name_or_path="org/base-model"), "org/base-model"),
    ],
)
def test_chat_prompts_for_a_tokenizer_without_a_template_name_the_model(tmp_path, tokenizer, named):
    path = write_rows(tmp_path / "rows.jsonl", [{"prompt": [{"role": "user", "content": "hi"}], "ground_truth": "2"}])
    with pytest.raises(DataError) as info:
        load_prompts([path], tokenizer, 64)
    assert str(info.value) == (
        f"{path}: row 0: the prompt is chat messages, but the model's tokenizer has no chat template ({named}): give "
        "string prompts, or a model whose tokenizer_config.json or chat_template.jinja holds one"
    )


def with_bos():
    """The char tokenizer adding an EOS in front of every text it encodes with special tokens, as
    a tokenizer with a BOS does."""
    from tokenizers import processors

    tok = build_char_tokenizer()
    tok.backend_tokenizer.post_processor = processors.TemplateProcessing(
        single=f"{tok.eos_token} $A", special_tokens=[(tok.eos_token, tok.eos_token_id)]
    )
    assert tok("12").input_ids == [tok.eos_token_id, *tok("12", add_special_tokens=False).input_ids]
    return tok


def test_prompts_are_counted_without_special_tokens_and_one_at_the_limit_is_kept(tmp_path):
    tok = with_bos()
    rows = [{"prompt": "12+34=", "ground_truth": "46"}, {"prompt": "1+2+3+4=", "ground_truth": "10"}]
    path = write_rows(tmp_path / "rows.jsonl", [rows[1], rows[0], rows[1], rows[0]])
    loaded = load_prompts([path], tok, 6)  # "12+34=" is 6 tokens, "1+2+3+4=" 8
    assert [r.prompt_ids for r in loaded.rows] == [tok("12+34=", add_special_tokens=False).input_ids] * 2
    assert [len(r.prompt_ids) for r in loaded.rows] == [6, 6] and loaded.dropped_too_long == 2


def test_a_folder_that_is_no_saved_data_set_lists_at_most_five_of_its_files(tmp_path):
    (tmp_path / "empty").mkdir()
    with pytest.raises(DataError) as info:
        read_rows(str(tmp_path / "empty"))
    assert str(info.value).endswith("(no state.json or dataset_dict.json); name its data files instead")
    (tmp_path / "many").mkdir()
    for i in range(6):
        (tmp_path / "many" / f"part{i}.jsonl").write_text("")
    with pytest.raises(DataError) as info:
        read_rows(str(tmp_path / "many"))
    listed = [f"part{i}.jsonl" for i in range(5)]
    assert str(info.value).endswith(f"name its data files instead (it holds {listed})")


def test_a_saved_data_set_of_several_splits_is_named_with_its_splits(tmp_path):
    import datasets

    rows = {"prompt": ["1+1="], "ground_truth": ["2"]}
    splits = datasets.DatasetDict({"train": datasets.Dataset.from_dict(rows), "test": datasets.Dataset.from_dict(rows)})
    splits.save_to_disk(str(tmp_path / "saved"))
    assert not (tmp_path / "saved" / "state.json").exists()  # only dataset_dict.json marks it
    with pytest.raises(DataError) as info:
        read_rows(str(tmp_path / "saved"))
    assert str(info.value) == f"{tmp_path}/saved: holds several splits ['train', 'test']; point at one split's folder"


@pytest.mark.parametrize("name, kind", [("rows.txt", ".txt"), ("rows", "extension-less")])
def test_a_format_rlpost_does_not_read_is_named_in_full(tmp_path, name, kind):
    (tmp_path / name).write_text("1+2=\t3\n")
    with pytest.raises(DataError) as info:
        read_rows(str(tmp_path / name))
    assert str(info.value) == (
        f"{tmp_path / name}: rlpost does not read {kind} files; give rows as .jsonl (one JSON object a line), .json "
        "(one array), .csv (a header line), .parquet or a datasets.save_to_disk folder"
    )


def test_a_hub_id_is_loaded_with_its_split_or_train(monkeypatch):
    import datasets

    asked = []

    def load_dataset(name, split):
        asked.append((name, split))
        return [{"prompt": "1+1=", "ground_truth": "2"}]

    monkeypatch.setattr(datasets, "load_dataset", load_dataset)
    assert read_rows("org/sums") == [{"prompt": "1+1=", "ground_truth": "2"}]
    read_rows("org/sums:test[:10%]")  # a split's slice has a colon of its own
    assert asked == [("org/sums", "train"), ("org/sums", "test[:10%]")]


def test_a_loader_holding_exactly_one_batch_serves_it_every_epoch():
    loader = PromptLoader(list("abcd"), 4, seed=0)
    place = lambda: {k: loader.state_dict()[k] for k in ("epoch", "position")}  # noqa: E731
    assert place() == {"epoch": 0, "position": 0}
    assert sorted(next(loader)) == list("abcd") and place() == {"epoch": 0, "position": 4}
    assert sorted(next(loader)) == list("abcd") and place() == {"epoch": 1, "position": 4}


def test_the_shuffled_order_of_a_seed_is_fixed_across_versions():
    """A checkpoint stores (epoch, position) only: a run resumed by another rlpost version reads on
    in the same order only if seed and epoch still give the same shuffle (these were recorded)."""
    loader = PromptLoader(list(range(8)), 8, seed=1)
    assert [next(loader), next(loader)] == [[6, 2, 3, 0, 1, 4, 7, 5], [1, 4, 3, 6, 7, 5, 2, 0]]
