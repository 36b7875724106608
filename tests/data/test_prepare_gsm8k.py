"""scripts/prepare_gsm8k.py on a small local fixture in the hub's layout (main/<split>-*.parquet)."""

import importlib.util
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from rlpost.data.dataset import load_prompts
from rlpost.rewards import REWARDS, RewardInput
from rlpost.tiny.model import build_char_tokenizer

SCRIPT = Path(__file__).resolve().parents[2] / "scripts" / "prepare_gsm8k.py"


@pytest.fixture(scope="module")
def prepare():
    spec = importlib.util.spec_from_file_location("prepare_gsm8k", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def hub_layout(folder, rows_by_split):
    (folder / "main").mkdir(parents=True)
    for split, rows in rows_by_split.items():
        pq.write_table(pa.Table.from_pylist(rows), folder / "main" / f"{split}-00000-of-00001.parquet")


def test_converts_hub_layout_into_rlpost_rows(prepare, tmp_path):
    rows = [
        {"question": "Tom has 3 apples and buys 4. How many?", "answer": "3+4=<<3+4=7>>7\n#### 7"},
        {"question": "A farm has 1,200 hens.", "answer": "so\n#### 1,200"},
    ]
    hub_layout(tmp_path / "src", {"train": rows, "test": rows[:1]})
    assert prepare.main(["--src", str(tmp_path / "src"), "--out", str(tmp_path / "out")]) == 0
    out = pq.read_table(tmp_path / "out" / "train.parquet").to_pylist()
    assert [r["ground_truth"] for r in out] == ["7", "1200"]
    assert out[0]["data_source"] == "gsm8k"
    assert out[0]["prompt"][0]["role"] == "user" and "####" in out[0]["prompt"][0]["content"]
    # the converted files load through rlpost's one loader and score with the gsm8k reward
    loaded = load_prompts([str(tmp_path / "out" / "test.parquet")], build_char_tokenizer(), 4096).rows
    assert len(loaded) == 1 and loaded[0].prompt_text.startswith("user: Tom has 3 apples")
    sample = RewardInput(loaded[0].prompt_text, "3 plus 4\n#### 7", loaded[0].ground_truth, "gsm8k")
    assert REWARDS["gsm8k"](sample) == 1.0


def test_row_without_final_answer_is_named(prepare, tmp_path):
    hub_layout(tmp_path / "src", {"train": [{"question": "q", "answer": "no marker"}], "test": []})
    with pytest.raises(ValueError, match="train row 0: field 'answer' has no '#### <number>'"):
        prepare.main(["--src", str(tmp_path / "src"), "--out", str(tmp_path / "out")])
