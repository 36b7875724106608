#!/usr/bin/env python3
"""Turn GSM8K (the Hugging Face `openai/gsm8k` layout: `question`, `answer` ending in `#### n`)
into rlpost rows: chat-message `prompt`, `ground_truth` (the number after ####), `data_source`.

    python scripts/prepare_gsm8k.py --src openai/gsm8k --out data/gsm8k          # from the hub
    python scripts/prepare_gsm8k.py --src path/to/gsm8k --out data/gsm8k         # a local copy

A local copy is a folder holding, for each split, `<split>.jsonl`, `<split>.parquet`, or the hub's
`main/<split>-*.parquet` files. Writes `<out>/train.parquet` and `<out>/test.parquet`.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

INSTRUCTION = 'Let\'s think step by step and output the final answer after "####".'
SPLITS = ("train", "test")


def extract_answer(answer: str, where: str) -> str:
    if "####" not in answer:
        raise ValueError(f"{where}: field 'answer' has no '#### <number>' line")
    return answer.split("####")[-1].strip().replace(",", "")


def convert_row(row: dict, where: str) -> dict:
    for key in ("question", "answer"):
        if not isinstance(row.get(key), str):
            raise ValueError(f"{where}: field '{key}' is missing or not a string")
    return {
        "prompt": [{"role": "user", "content": f"{row['question'].strip()} {INSTRUCTION}"}],
        "ground_truth": extract_answer(row["answer"], where),
        "data_source": "gsm8k",
    }


def read_split(src: str, split: str) -> list[dict]:
    folder = Path(src).expanduser()
    if folder.is_dir():
        candidates = [
            folder / f"{split}.jsonl",
            folder / f"{split}.parquet",
            *sorted((folder / "main").glob(f"{split}-*.parquet")),
        ]
        for path in candidates:
            if not path.is_file():
                continue
            if path.suffix == ".jsonl":
                return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
            import pyarrow.parquet as pq

            files = [path] if path.parent == folder else sorted((folder / "main").glob(f"{split}-*.parquet"))
            return [r for f in files for r in pq.read_table(f).to_pylist()]
        raise FileNotFoundError(f"{folder}: no {split}.jsonl, {split}.parquet or main/{split}-*.parquet")
    import datasets

    return list(datasets.load_dataset(src, "main", split=split))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--src", default="openai/gsm8k")
    parser.add_argument("--out", default="data/gsm8k")
    args = parser.parse_args(argv)
    import pyarrow as pa
    import pyarrow.parquet as pq

    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    for split in SPLITS:
        rows = [convert_row(r, f"{args.src} {split} row {i}") for i, r in enumerate(read_split(args.src, split))]
        pq.write_table(pa.Table.from_pylist(rows), out / f"{split}.parquet")
        print(f"{out / f'{split}.parquet'}: {len(rows)} rows")
    return 0


if __name__ == "__main__":
    sys.exit(main())
