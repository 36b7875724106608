import json

import pytest
import torch

from rlpost.data.batch import Batch
from rlpost.data.dataset import DataError, PromptLoader, load_prompts, read_rows
from rlpost.data.tasks import arithmetic_split, carry_slip
from rlpost.tiny.model import build_char_tokenizer


@pytest.fixture(scope="module")
def tokenizer():
    return build_char_tokenizer()


def write(path, rows):
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return str(path)


def test_jsonl_parquet_and_saved_dataset_load_alike(tmp_path, tokenizer):
    import datasets
    import pyarrow as pa
    import pyarrow.parquet as pq

    rows = [
        {"prompt": "1+2=", "ground_truth": "3", "data_source": "arithmetic"},
        {"prompt": [{"role": "user", "content": "2+2="}], "ground_truth": 4},
    ]
    jsonl = write(tmp_path / "a.jsonl", rows)
    pq.write_table(pa.Table.from_pylist([rows[0]]), tmp_path / "a.parquet")
    datasets.Dataset.from_list([rows[0]]).save_to_disk(str(tmp_path / "saved"))
    loaded = load_prompts([jsonl], tokenizer, 64, default_data_source="gsm8k").rows
    assert loaded[0].prompt_text == "1+2=" and loaded[0].prompt_ids == tokenizer("1+2=").input_ids
    assert loaded[1].prompt_text == "user: 2+2=\nassistant: "  # chat template applied
    assert loaded[1].ground_truth == "4" and loaded[1].data_source == "gsm8k"
    assert read_rows(str(tmp_path / "a.parquet")) == [rows[0]]
    assert read_rows(str(tmp_path / "saved")) == [rows[0]]


@pytest.mark.parametrize(
    "row, message",
    [
        ({"ground_truth": "1"}, "row 1: field 'prompt' is missing"),
        ({"prompt": 5, "ground_truth": "1"}, "row 1: field 'prompt' must be a string"),
        ({"prompt": [{"role": "user"}], "ground_truth": "1"}, "row 1: field 'prompt' message 0"),
        ({"prompt": "x", "ground_truth": None}, "row 1: field 'ground_truth' is null"),
        ({"prompt": "x", "ground_truth": [1]}, "row 1: field 'ground_truth' must be a string or number"),
        ({"prompt": "x", "ground_truth": "1", "data_source": 3}, "row 1: field 'data_source'"),
    ],
)
def test_bad_rows_name_file_row_and_field(tmp_path, tokenizer, row, message):
    path = write(tmp_path / "bad.jsonl", [{"prompt": "ok", "ground_truth": "1"}, row])
    with pytest.raises(DataError, match=message) as info:
        load_prompts([path], tokenizer, 64)
    assert "bad.jsonl" in str(info.value)


def test_invalid_json_and_missing_file(tmp_path, tokenizer):
    path = tmp_path / "broken.jsonl"
    path.write_text('{"prompt": "a", "ground_truth": "1"}\n{oops\n')
    with pytest.raises(DataError, match="broken.jsonl: row 1: not valid JSON"):
        load_prompts([str(path)], tokenizer, 64)
    with pytest.raises(DataError, match="no such file"):
        load_prompts([str(tmp_path / "missing.jsonl")], tokenizer, 64)


def test_long_prompts_are_dropped_and_counted(tmp_path, tokenizer):
    path = write(
        tmp_path / "a.jsonl",
        [{"prompt": "1+1=", "ground_truth": "2"}, {"prompt": "123456789+1=", "ground_truth": "123456790"}],
    )
    result = load_prompts([path], tokenizer, max_prompt_length=5)
    assert len(result.rows) == 1 and result.dropped_too_long == 1


def test_loader_resumes_exactly():
    rows = list(range(10))
    a = PromptLoader(rows, batch_size=3, seed=1)
    seen = [next(a) for _ in range(4)]  # crosses an epoch boundary (3 batches per epoch)
    state = a.state_dict()
    rest = [next(a) for _ in range(3)]
    b = PromptLoader(rows, batch_size=3, seed=1)
    b.load_state_dict(state)
    assert [next(b) for _ in range(3)] == rest
    assert len(set(sum(seen[:3], []))) == 9  # one epoch: no row twice
    assert all(len(x) == 3 for x in seen + rest)
    with pytest.raises(DataError, match="fewer than data.train_batch_size=20"):
        PromptLoader(rows, batch_size=20, seed=0)


def test_arithmetic_split_is_disjoint_and_stable():
    train, val = arithmetic_split(2, seed=0, num_val=50)
    assert len(train) + len(val) == 90 * 90
    assert not {r["prompt"] for r in train} & {r["prompt"] for r in val}
    assert arithmetic_split(2, seed=0, num_val=50)[1] == val
    for row in val:  # fixed-width answers: digits + 1 characters, zero-padded
        a, b = map(int, row["prompt"][:-1].split("+"))
        assert row["ground_truth"] == f"{a + b:03d}"
    assert arithmetic_split(1, seed=0, num_val=5)[1][0]["ground_truth"] in {f"{v:02d}" for v in range(19)}


def test_carry_slip_forgets_the_carry_at_its_rate_and_only_where_one_carries():
    import random

    rows = {
        "carry": {"prompt": "57+38=", "ground_truth": "095", "data_source": "arithmetic"},
        "none": {"prompt": "52+31=", "ground_truth": "083", "data_source": "arithmetic"},
    }
    rng = random.Random(0)
    answers = [carry_slip(rows["carry"], rng, 0.7)["ground_truth"] for _ in range(4000)]
    assert set(answers) == {"095", "085"}
    assert abs(answers.count("085") / 4000 - 0.7) < 0.03
    assert all(carry_slip(rows["none"], rng, 1.0) == rows["none"] for _ in range(50))
    assert all(carry_slip(rows["carry"], rng, 0.0) == rows["carry"] for _ in range(50))
    # a sum over 100 keeps its width: 75+48 = 123 -> 113
    assert carry_slip({**rows["carry"], "prompt": "75+48=", "ground_truth": "123"}, rng, 1.0)["ground_truth"] == "113"


def test_pass_at_k_is_the_unbiased_estimator():
    from itertools import combinations

    from rlpost.metrics.passk import pass_at_k, pass_at_ks

    for n, c, k in [(8, 3, 1), (8, 3, 4), (6, 0, 2), (6, 6, 3), (5, 2, 5)]:
        verdicts = [True] * c + [False] * (n - c)
        subsets = list(combinations(verdicts, k))  # the chance a random k-subset holds a right one
        assert abs(pass_at_k(n, c, k) - sum(any(s) for s in subsets) / len(subsets)) < 1e-12
    assert pass_at_ks([[True, False], [False, False]], [1, 2]) == {"pass@1": 0.25, "pass@2": 0.5}
    with pytest.raises(ValueError):
        pass_at_k(4, 1, 5)


def test_batch_chunk_select_cat():
    b = Batch({"x": torch.arange(6), "y": torch.arange(12).view(6, 2)})
    parts = b.chunk(3)
    assert [p["x"].tolist() for p in parts] == [[0, 1], [2, 3], [4, 5]]
    assert torch.equal(Batch.cat(parts)["y"], b["y"])
    assert b.select([5, 0])["x"].tolist() == [5, 0]
    with pytest.raises(ValueError, match="evenly"):
        b.chunk(4)
    with pytest.raises(ValueError, match="disagree"):
        Batch({"x": torch.zeros(2), "y": torch.zeros(3)})
    with pytest.raises(KeyError, match="has no 'z'"):
        b["z"]


@pytest.mark.parametrize("protocol", [2, 5])
def test_a_pickled_batch_is_its_rows_values_dtypes_and_nothing_more(protocol):
    """Every dtype rlpost ships (bfloat16 too) comes back equal; a batch that views 2 rows of a
    larger tensor pickles those rows only (torch's own tensor pickling saves the whole storage);
    a read-only buffer (Ray's) gives a tensor that can be written."""
    import pickle
    import warnings

    big = torch.randn(1000, 64)
    b = Batch(
        {
            "view": big[10:12],
            "strided": torch.arange(12).view(2, 6)[:, ::2],
            "bf16": torch.randn(2, 3).bfloat16(),
            "half": torch.randn(2, 3).half(),
            "mask": torch.tensor([[True, False], [False, True]]),
            "long": torch.tensor([2**40, -1]),
            "empty": torch.zeros(2, 0),
        }
    )
    buffers = []
    wire = pickle.dumps(b, protocol=protocol, buffer_callback=buffers.append if protocol == 5 else None)
    assert len(wire) + sum(len(memoryview(x)) for x in buffers) < 4 * 1000  # not the 256 KB storage
    with warnings.catch_warnings():  # torch warns when it wraps a read-only array
        warnings.simplefilter("error")
        back = pickle.loads(wire, buffers=[memoryview(bytes(x.raw())) for x in buffers])  # read-only
    assert back.keys() == b.keys()
    for k in b.keys():
        assert back[k].dtype == b[k].dtype and torch.equal(back[k], b[k]), k
    back["view"][0, 0] = 7.0
    assert b["view"][0, 0] != 7.0
    weights = torch.zeros(2, requires_grad=True)  # kept as torch pickles it
    assert torch.equal(pickle.loads(pickle.dumps(Batch({"w": weights})))["w"], weights.detach())


def test_auto_reward_routing_fails_early_naming_the_source():
    from rlpost.controller.setup import check_reward_routing
    from rlpost.data.dataset import PromptRow

    ok = PromptRow([1], "1+1=", "2", "arithmetic")
    check_reward_routing([ok], "auto")
    check_reward_routing([PromptRow([1], "x", "2", "mystery")], "my.py:fn")  # explicit fn: no routing
    with pytest.raises(DataError, match="data_source 'mystery'"):
        check_reward_routing([ok, PromptRow([1], "x", "2", "mystery")], "auto")
    with pytest.raises(DataError, match="rows without a data_source"):
        check_reward_routing([PromptRow([1], "x", "2", "")], "auto")


def test_each_epoch_is_a_new_shuffle_of_every_row_and_shuffle_false_keeps_the_order():
    rows = list(range(12))
    loader = PromptLoader(rows, batch_size=4, seed=7)
    epochs = [sum((next(loader) for _ in range(3)), []) for _ in range(4)]
    assert all(sorted(e) == rows for e in epochs)  # every row once per epoch
    assert len({tuple(e) for e in epochs}) == 4  # reshuffled between epochs
    assert epochs[0] != rows  # and shuffled at all
    again = PromptLoader(rows, batch_size=4, seed=7)  # the seed decides the orders
    assert [sum((next(again) for _ in range(3)), []) for _ in range(4)] == epochs
    other = PromptLoader(rows, batch_size=4, seed=8)
    assert sum((next(other) for _ in range(3)), []) != epochs[0]
    plain = PromptLoader(rows, batch_size=4, seed=7, shuffle=False)
    assert [sum((next(plain) for _ in range(3)), []) for _ in range(2)] == [rows, rows]


def test_a_csv_row_with_more_or_fewer_fields_than_its_header_is_refused_by_row(tmp_path):
    """The fourteenth catalogue's t09: `5,9+63=,122` under `prompt,ground_truth` (a prompt's comma
    unquoted) trained the prompt "5" against the answer "9+63="; a quoted comma is one field."""
    path = tmp_path / "d.csv"
    path.write_text('prompt,ground_truth\n"5,9+63=",122\n1+1=,2\n5,9+63=,122\n')
    with pytest.raises(DataError) as info:
        read_rows(str(path))
    assert str(info.value) == (
        f"{path}: row 2: 3 fields, where its header 'prompt,ground_truth' has 2; a field that holds a comma must "
        'be quoted ("5,9+63=")'
    )
    path.write_text("prompt,ground_truth\n1+1=,2\n2+2=\n")
    with pytest.raises(DataError, match=r"d.csv: row 1: 1 fields, where its header 'prompt,ground_truth' has 2"):
        read_rows(str(path))
    path.write_text('prompt,ground_truth\n"5,9+63=",122\n')
    assert read_rows(str(path)) == [{"prompt": "5,9+63=", "ground_truth": "122"}]


def test_a_json_file_holding_its_rows_under_a_key_is_named_not_called_invalid(tmp_path):
    """The fourteenth catalogue's t19: `{"rows": [...]}` pretty-printed was "row 0: not valid JSON"."""
    rows = [{"prompt": f"{i}+1=", "ground_truth": str(i + 1)} for i in range(3)]
    path = tmp_path / "d.json"
    path.write_text(json.dumps({"rows": rows, "note": "mine"}, indent=2))
    with pytest.raises(DataError) as info:
        read_rows(str(path))
    assert str(info.value) == (
        f"{path}: one JSON object (keys 'rows', 'note'), not rows: a .json file holds one array of row objects, or "
        "one object a line; the rows look to be under 'rows': write that list as the file"
    )
    path.write_text("\n".join(json.dumps(r) for r in rows))  # JSON lines in a .json: read as before
    assert read_rows(str(path)) == rows
    path.write_text(json.dumps(rows, indent=2))
    assert read_rows(str(path)) == rows
