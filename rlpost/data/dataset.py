"""Loading prompt rows, checking them, tokenizing them, and iterating over them resumably.

One loader for every source: `.jsonl` (one object per line; `.json` too, or one array of
objects), `.csv` (a header line), `.parquet`, a folder written by `datasets.Dataset.save_to_disk`,
or a Hugging Face hub id (`name[:split]`). Every row must have `prompt` (a string, or chat messages
`[{"role", "content"}, ...]`) and `ground_truth` (string or number); `data_source` is optional.
A bad row stops the load with an error that names the file, the row number and the field. Prompts
longer than `data.max_prompt_length` tokens are dropped and counted, not fatal.

String prompts are tokenized as they are; chat messages go through the tokenizer's chat template
with the generation prompt appended.
"""

from __future__ import annotations

import csv
import decimal
import functools
import glob
import io
import json
import math
import numbers
import random
from dataclasses import dataclass, field
from pathlib import Path

from rlpost.data.json_layout import columns_layout, not_rows, one_value_a_key
from rlpost.data.scalars import plain_number, unwrap_scalar


class DataError(ValueError):
    """A data row or file is malformed: the message names file, row and field."""


@dataclass(frozen=True)
class PromptRow:
    prompt_ids: list[int]
    prompt_text: str
    ground_truth: str
    data_source: str


FORMATS = (".jsonl", ".json", ".csv", ".parquet")
CHAT_ROLES = ("system", "user", "assistant", "tool", "developer", "ipython")


def read_rows(source: str) -> list[dict]:
    """Raw rows of one source (file, saved dataset folder or hub id)."""
    path = Path(source).expanduser()
    suffix = path.suffix.lower()  # ROWS.JSONL too
    if path.exists() and not path.is_file() and not path.is_dir():  # /dev/stdin, a fifo (the sixteenth's t120)
        raise DataError(f"{path}: not a regular file (a pipe or a device): save the rows to a file")
    if path.is_file() and lfs_pointer(path):
        raise DataError(
            f"{path}: a Git LFS pointer, not the data (a repository cloned without git-lfs): fetch the file "
            "(git lfs pull) or download it"
        )
    if suffix in (".jsonl", ".json", ".csv") and path.is_file():
        return read_text_rows(path, suffix)
    if suffix == ".parquet" and path.is_file():
        import pyarrow.parquet as pq

        try:
            return pq.read_table(path).to_pylist()
        except (OSError, ValueError) as e:  # pyarrow's ArrowInvalid is a ValueError: a damaged or other file
            raise DataError(f"{path}: not a readable parquet file ({e}); write it again") from None
    if path.is_dir():
        if not any((path / marker).is_file() for marker in ("state.json", "dataset_dict.json")):
            inside = sorted(p.name for p in path.iterdir() if p.suffix in FORMATS)
            raise DataError(
                f"{path}: a folder that datasets.save_to_disk did not write (no state.json or dataset_dict.json); "
                f"name its data files instead{f' (it holds {inside[:5]})' if inside else ''}"
            )
        import datasets

        loaded = datasets.load_from_disk(str(path))
        if isinstance(loaded, datasets.DatasetDict):
            raise DataError(f"{path}: holds several splits {list(loaded)}; point at one split's folder")
        return list(loaded)
    if suffix in FORMATS:
        matches = sorted(glob.glob(str(path))) if glob.has_magic(str(path)) else []
        wildcard = f" (wildcards are not expanded: list the files, e.g. [{','.join(matches[:2])}])" if matches else ""
        if path.is_symlink():  # (the ninth catalogue's n15: a link to itself was "no such file")
            raise DataError(f"{path}: a symbolic link that leads nowhere (in a loop, or to a file that is gone)")
        raise DataError(f"{path}: no such file{wildcard}")
    if path.is_file():
        raise DataError(
            f"{path}: rlpost does not read {path.suffix or 'extension-less'} files; give rows as .jsonl (one JSON "
            "object a line), .json (one array), .csv (a header line), .parquet or a datasets.save_to_disk folder"
        )
    return read_hub(source, path)


def lfs_pointer(path: Path) -> bool:
    """Whether `path` is a Git LFS pointer (a data set cloned without git-lfs: the sixteenth catalogue's
    t115, t116, refused as "not valid JSON" and "write it again")."""
    with open(path, "rb") as f:
        return f.read(40).startswith(b"version https://git-lfs.github.com/spec/")


def read_hub(source: str, path: Path) -> list[dict]:
    """Rows of a hub id (`org/name:split`, through datasets); a path that is not there is named as one."""
    if path.is_absolute() or source.startswith(("./", "../", "~")):  # a path, not a hub id (cat15's t04)
        near = sorted(str(p) for p in path.parent.glob(f"{glob.escape(path.stem)}.*") if p.suffix.lower() in FORMATS)
        raise DataError(
            f"{path}: no such file{f' (there is {near[0]})' if near else ''}; rlpost reads .jsonl, .json, .csv and "
            ".parquet files, datasets.save_to_disk folders and hub ids (org/name:split)"
        )
    import datasets

    name, _, split = source.partition(":")
    try:
        return list(datasets.load_dataset(name, split=split or "train"))
    except ConnectionError as e:  # no network, or no such data set on the hub
        raise DataError(
            f"{source}: not a local file, and the hub could not be reached ({e}); give a local .jsonl, .parquet, ... "
            "file, or run where the hub answers once (datasets caches it; HF_DATASETS_OFFLINE=1 then reads the cache)"
        ) from None
    except Exception as e:  # datasets' own words for a hub id it could not load (no such data set or split)
        why = (str(e).strip().splitlines() or [type(e).__name__])[0][:200]
        raise DataError(
            f"{source}: not a local file, and datasets could not load it as a hub id ({why}); give a local .jsonl, "
            ".json, .csv or .parquet file, a datasets.save_to_disk folder or a hub id (org/name:split)"
        ) from None


TOO_DEEP = "nested too deeply to read (lists or objects in each other past Python's recursion limit); flatten it"


def read_text_rows(path: Path, suffix: str) -> list[dict]:
    """Raw rows of a .jsonl (one object a line), .json (one array of objects) or .csv file."""
    text = read_text(path)
    if suffix == ".csv":
        return read_csv(path, text)
    if suffix == ".json" and text.lstrip().startswith("["):  # one JSON array of objects
        try:
            return json.loads(text, object_pairs_hook=one_value_a_key, parse_float=decimal.Decimal)
        except json.JSONDecodeError as e:
            raise DataError(f"{path}: not valid JSON ({e.msg}, line {e.lineno})") from None
        except KeyError as e:  # (the fifteenth catalogue's t01: the last value kept, as .jsonl refuses it)
            raise DataError(f"{path}: an object gives the key {e.args[0]!r} twice; give each key once") from None
        except RecursionError:  # (the nineteenth catalogue's t108: a raw RecursionError)
            raise DataError(f"{path}: {TOO_DEEP}") from None
    if suffix == ".json" and columns_layout(text):
        raise DataError(
            f"{path}: one JSON object of columns (pandas' DataFrame.to_json() default), not rows; write "
            "records: df.to_json(path, orient='records', lines=True) as .jsonl"
        )
    # JSON Lines ends a row at "\n" only: str.splitlines() also splits at U+2028, U+0085, ..., which a
    # JSON string may hold unescaped (the fifteenth catalogue's t02: a valid row read as two halves)
    if suffix == ".json" and (said := not_rows(text, one_line=len([x for x in text.split("\n") if x.strip()]) < 2)):
        raise DataError(f"{path}: {said}")
    rows = []
    for i, line in enumerate(text.split("\n")):
        if not line.strip():
            continue
        try:
            rows.append(json.loads(line, object_pairs_hook=one_value_a_key, parse_float=decimal.Decimal))
        except json.JSONDecodeError as e:
            raise DataError(f"{path}: row {i}: not valid JSON ({e.msg}); want one JSON object a line") from None
        except KeyError as e:
            raise DataError(f"{path}: row {i}: the key {e.args[0]!r} is given twice; give each key once") from None
        except RecursionError:
            raise DataError(f"{path}: row {i}: {TOO_DEEP}") from None
    return rows


def read_csv(path: Path, text: str) -> list[dict]:
    """A CSV file's rows by its header; one saved with semicolons (a spreadsheet's export in many
    locales) is named, not read as one field; a row with more or fewer fields than the header (an
    unquoted comma in a prompt: the fourteenth catalogue's t09, read with shifted columns) is refused."""
    reader = csv.DictReader(io.StringIO(text))
    rows = list(reader)
    header = text.splitlines()[0] if text.strip() else ""
    if "," not in header and (sep := next((c for c in ";\t|" if c in header), None)):  # (tab: the sixteenth's t114)
        said = {";": "';'", "\t": "tabs", "|": "'|'"}[sep]
        raise DataError(f"{path}: its header {header!r} is separated by {said}, not ','; save the file with commas")
    twice = sorted({n for n in reader.fieldnames or [] if reader.fieldnames.count(n) > 1})
    if twice:  # DictReader keeps the last column of a name (the fifteenth catalogue's t03)
        raise DataError(
            f"{path}: its header {header!r} names {', '.join(map(repr, twice))} twice; name each column once"
        )
    for i, row in enumerate(rows):
        if None in row or None in row.values():  # (DictReader: the extra fields under None, the missing as None)
            fields = len(reader.fieldnames) + len(row.get(None, [])) - sum(v is None for v in row.values())
            raise DataError(
                f"{path}: row {i}: {fields} fields, where its header {header!r} has {len(reader.fieldnames)}; a field "
                'that holds a comma must be quoted ("5,9+63=")'
            )
    return rows


MAGIC = {b"\x1f\x8b": "gzip", b"BZh": "bzip2", b"\xfd7zXZ": "xz", b"PK\x03\x04": "zip", b"\x28\xb5\x2f\xfd": "zstd"}


def read_text(path: Path) -> str:
    """A data file's text: UTF-8, a byte-order mark (some Windows editors write one) left out."""
    try:
        return path.read_text(encoding="utf-8-sig")
    except UnicodeDecodeError as e:
        packed = next((name for magic, name in MAGIC.items() if path.read_bytes().startswith(magic)), None)
        if packed:  # (cat20's t23: a gzip file named .jsonl was told to save itself as UTF-8)
            raise DataError(f"{path}: {packed}-compressed, though named {path.suffix}: decompress it") from None
        row = path.read_bytes()[: e.start].count(b"\n")
        raise DataError(
            f"{path}: row {row}: not UTF-8 text ({e.reason} at byte {e.start}); save the file as UTF-8"
        ) from None


def check_row(row: dict, where: str) -> dict:
    """Validate one row's fields; return it normalised (`ground_truth` as str)."""
    if not isinstance(row, dict):
        array = isinstance(row, list) and row and all(isinstance(x, dict) for x in row)  # a file of one array
        hint = " (a file holding one JSON array is read as .json: rename it)" if array else ""
        raise DataError(f"{where}: expected an object with 'prompt' and 'ground_truth', got {type(row).__name__}{hint}")
    for key in ("prompt", "ground_truth"):
        if key not in row:
            verl = key == "ground_truth" and isinstance(row.get("reward_model"), dict) and key in row["reward_model"]
            hint = "; verl's layout: write reward_model.ground_truth as a top-level ground_truth" if verl else ""
            raise DataError(f"{where}: field '{key}' is missing (fields present: {sorted(row)}){hint}")
        if row[key] is None:
            raise DataError(f"{where}: field '{key}' is null")
    prompt = row["prompt"]
    if isinstance(prompt, list):
        if not prompt:
            raise DataError(f"{where}: field 'prompt' is an empty list of chat messages")
        for j, m in enumerate(prompt):
            if not (isinstance(m, dict) and isinstance(m.get("role"), str) and isinstance(m.get("content"), str)):
                raise DataError(f"{where}: field 'prompt' message {j} must be {{'role': str, 'content': str}}")
            if m["role"] not in CHAT_ROLES:  # a typo would reach the template as a speaker of its own
                raise DataError(f"{where}: field 'prompt' message {j} has role {m['role']!r}, not one of {CHAT_ROLES}")
    elif not isinstance(prompt, str):
        raise DataError(
            f"{where}: field 'prompt' must be a string or a list of chat messages, got {type(prompt).__name__}"
        )
    gt = unwrap_scalar(row["ground_truth"])  # a numpy scalar (pandas, datasets)
    if isinstance(gt, bool) or not isinstance(gt, (str, numbers.Real, decimal.Decimal)):
        raise DataError(f"{where}: field 'ground_truth' must be a string or number, got {type(gt).__name__}")
    if not isinstance(gt, str):
        gt = number_text(gt, where)
    source = row.get("data_source")
    if source is not None and not isinstance(source, str):
        raise DataError(f"{where}: field 'data_source' must be a string, got {type(source).__name__}")
    return {"prompt": prompt, "ground_truth": gt, "data_source": source}


def number_text(value: numbers.Real | decimal.Decimal, where: str) -> str:
    """A number written as a person would: 123.0 (an integer column as pandas writes it) is "123",
    so that a scorer comparing text gives the right answer 1. A JSON file's decimals come as Decimal
    and keep the digits a float would drop (123456789012345678.9: the sixteenth catalogue's t179)."""
    if not math.isfinite(float(value)):
        raise DataError(f"{where}: field 'ground_truth' is {value}, not a number to score against")
    if isinstance(value, decimal.Decimal) and decimal.Decimal(repr(float(value))) != value:
        return str(int(value)) if value == value.to_integral_value() else format(value, "f")
    return plain_number(float(value) if isinstance(value, decimal.Decimal) else value)


def render_prompt(prompt, tokenizer, tools: list[dict] | None = None) -> str:
    """A string prompt as it is; chat messages through the chat template, with the `tools` (JSON
    schemas) the template advertises to the model. Messages that end with the assistant's are a
    prefill, which the response continues (the seventeenth catalogue's t30b: a new turn was opened)."""
    if isinstance(prompt, str):
        return prompt
    prefill = bool(prompt) and isinstance(prompt[-1], dict) and prompt[-1].get("role") == "assistant"
    return tokenizer.apply_chat_template(
        prompt, tools=tools or None, tokenize=False, add_generation_prompt=not prefill, continue_final_message=prefill
    )


def prompt_ids(prompt, tokenizer, tools, where: str) -> tuple[str, list[int]]:
    """The prompt's text and token ids; text the tokenizer cannot take (an unpaired surrogate) or
    a chat template that fails on it is named with the row, not a traceback."""
    from jinja2 import TemplateError

    try:
        text = render_prompt(prompt, tokenizer, tools)
        return text, tokenizer(text, add_special_tokens=False).input_ids
    except TemplateError as e:
        folder = getattr(tokenizer, "name_or_path", "")
        raise DataError(
            f"{where}: the model's chat template fails on this prompt ({type(e).__name__}: {e}): fix the template "
            f"(chat_template.jinja or tokenizer_config.json's chat_template in {folder})"
        ) from None
    except (TypeError, UnicodeError) as e:
        raise DataError(
            f"{where}: the prompt holds text the tokenizer cannot take ({type(e).__name__}: "
            f"{str(e).splitlines()[0][:120]}), e.g. a lone UTF-16 surrogate written as \\ud800: fix the row"
        ) from None


@dataclass
class LoadResult:
    rows: list[PromptRow]
    dropped_too_long: int
    defaulted: int = 0  # rows without a data_source of their own, given `default_data_source`
    chat: int = 0  # rows whose prompt is chat messages
    files: dict[str, range] = field(default_factory=dict)  # each source's rows: rows[span]


def load_prompts(
    sources: list[str], tokenizer, max_prompt_length: int, default_data_source: str = "", tools_of=None, scorer=None
) -> LoadResult:
    """Read, check and tokenize every row of `sources`; drop (and count) over-long prompts.
    `tools_of(row)`: the tool schemas a row's chat-message prompt advertises (multi-turn runs).
    `scorer(data_source)`: the name of rlpost's own scorer of those rows (which compares answers
    with the ground truth: an empty one is refused), or None (the user's function)."""
    rows, dropped, defaulted, chats, files = [], 0, 0, 0, {}
    for source in sources:
        kept, shortest_dropped = len(rows), None
        for i, raw in enumerate(read_rows(source)):
            row = check_row(raw, f"{source}: row {i}")
            named = scorer(row["data_source"] or default_data_source) if scorer else None
            if named and not row["ground_truth"].strip():
                raise DataError(
                    f"{source}: row {i}: field 'ground_truth' is empty, and reward {named!r} scores answers "
                    "against it: give the row its answer, or leave the row out"
                )
            chat = not isinstance(row["prompt"], str)
            if chat and not getattr(tokenizer, "chat_template", None):
                raise DataError(
                    f"{source}: row {i}: the prompt is chat messages, but the model's tokenizer has no chat template "
                    f"({getattr(tokenizer, 'name_or_path', '') or 'model.path'}): give string prompts, or a model "
                    "whose tokenizer_config.json or chat_template.jinja holds one"
                )
            tools = tools_of(row) if tools_of and chat else None
            text, ids = prompt_ids(row["prompt"], tokenizer, tools, f"{source}: row {i}")
            if len(ids) > max_prompt_length:
                dropped += 1
                shortest_dropped = min(shortest_dropped or len(ids), len(ids))
                continue
            if not ids or not text.strip():  # (spaces only: a cell or template that rendered nothing, cat16's t130)
                raise DataError(f"{source}: row {i}: field 'prompt' is empty{' (spaces only)' * bool(ids)}")
            rows.append(PromptRow(ids, text, row["ground_truth"], row["data_source"] or default_data_source))
            defaulted, chats = defaulted + (not row["data_source"]), chats + chat
        files[source] = range(kept, len(rows))
        if len(rows) == kept and shortest_dropped is not None:
            raise DataError(
                f"{source}: every prompt is longer than data.max_prompt_length={max_prompt_length} tokens "
                f"(the shortest has {shortest_dropped}); raise data.max_prompt_length"
            )
    return LoadResult(rows, dropped, defaulted, chats, files)


class PromptLoader:
    """Endless batches of rows, reshuffled each epoch with a seed; `state_dict` resumes exactly.

    The last incomplete batch of an epoch is dropped, so every step sees `batch_size` prompts."""

    def __init__(self, rows: list, batch_size: int, seed: int, shuffle: bool = True):
        if len(rows) < batch_size:
            raise DataError(f"{len(rows)} training rows are fewer than data.train_batch_size={batch_size}")
        self.rows, self.batch_size, self.seed, self.shuffle = rows, batch_size, seed, shuffle
        self.epoch, self.position = 0, 0
        self._order = self._epoch_order()

    def _epoch_order(self) -> list[int]:
        order = list(range(len(self.rows)))
        if self.shuffle:
            random.Random(self.seed * 100_003 + self.epoch).shuffle(order)
        return order

    def __iter__(self):
        return self

    def __next__(self) -> list:
        if self.position + self.batch_size > len(self.rows):
            self.epoch, self.position = self.epoch + 1, 0
            self._order = self._epoch_order()
        idx = self._order[self.position : self.position + self.batch_size]
        self.position += self.batch_size
        return [self.rows[i] for i in idx]

    def state_dict(self) -> dict:
        rows = {"rows": len(self.rows), "fingerprint": self.fingerprint}
        return {"epoch": self.epoch, "position": self.position, **rows}

    def load_state_dict(self, state: dict) -> None:
        """The place in the data where a checkpoint's run stopped; it counts that run's rows, so other
        rows (a file rewritten, other data settings) are refused, not trained from a place that means
        nothing for them (checkpoints from before the fingerprint are taken as they are)."""
        if state.get("fingerprint", self.fingerprint) != self.fingerprint:
            raise DataError(
                f"the training rows are not those the checkpoint's run trained on ({state['rows']} rows then, "
                f"{len(self.rows)} now, other prompts or answers): its place in them (epoch {state['epoch']}, row "
                f"{state['position']}) counts the old rows; resume with the same data.train_files and data settings, "
                "or start a new run"
            )
        self.epoch, self.position = state["epoch"], state["position"]
        self._order = self._epoch_order()

    @functools.cached_property
    def fingerprint(self) -> str:
        """The rows' prompts and answers, in order, hashed (once: the rows do not change)."""
        import hashlib

        digest = hashlib.sha1()
        for row in self.rows:
            digest.update(repr((getattr(row, "prompt_text", row), getattr(row, "ground_truth", None))).encode())
        return digest.hexdigest()
