"""The fourth catalogue of bad inputs (issue 39), tried by someone who did not write the code: the
cases about reward files, data files and the command line. Each is a clear error naming the key
or file and what to do, before anything starts. (Model folders: tests/test_fourth_catalogue.py;
the run folder and signals: tests/controller/test_run_dir.py, test_run.py.)"""

from __future__ import annotations

import pytest

from rlpost.data import userfile
from rlpost.rewards import get_reward_fn


def test_a_reward_file_that_exits_at_import_is_named(tmp_path):
    """`sys.exit("no GPU here")` at import ended the command with the user's words alone."""
    path = tmp_path / "r_exit.py"
    path.write_text('import sys\nsys.exit("no GPU here")\ndef score(sample):\n    return 0.0\n')
    with pytest.raises(ValueError) as info:
        get_reward_fn(f"{path}:score")
    assert str(info.value) == f"reward.fn='{path}:score': running {path} raised SystemExit at line 2: no GPU here"


def test_an_async_reward_function_is_refused_by_name(tmp_path):
    path = tmp_path / "r_async.py"
    path.write_text("async def score(sample):\n    return 1.0\n")
    with pytest.raises(ValueError) as info:
        get_reward_fn(f"{path}:score")
    assert str(info.value) == (
        f"reward.fn='{path}:score': score is an async function, which rlpost does not await: write it with def"
    )


def test_a_reward_file_without_its_function_says_to_add_it(tmp_path):
    with pytest.raises(ValueError) as info:
        get_reward_fn("rewards/r_bool.py")
    assert str(info.value) == (
        "reward.fn='rewards/r_bool.py' names a file, not its function: give reward.fn=rewards/r_bool.py:NAME"
    )


def test_a_reward_file_slow_to_import_is_said_to_be_running(tmp_path, monkeypatch, capsys):
    """A file that loads a judge model at import ran with no word at all."""
    monkeypatch.setattr(userfile, "SLOW_S", 0.2)
    path = tmp_path / "r_slow.py"
    path.write_text("import time\ntime.sleep(0.6)\ndef score(sample):\n    return 0.0\n")
    assert get_reward_fn(f"{path}:score")(None) == 0.0
    assert capsys.readouterr().err == f"rlpost: reward.fn='{path}:score': still running {path} after 0.2 s\n"
    monkeypatch.setattr(userfile, "SLOW_S", 5.0)  # (a margin for a busy machine)
    path.write_text("def score(sample):\n    return 1.0\n")  # a quick one: nothing said
    get_reward_fn(f"{path}:score")
    assert capsys.readouterr().err == ""


ROW = '{"prompt": "1+2=", "ground_truth": "3"}\n'


def test_data_files_beside_a_task_that_makes_the_rows_are_refused():
    """The quickstart's data.task=arithmetic made the rows and the user's files were ignored."""
    from rlpost.config import ConfigError, load_config

    with pytest.raises(ConfigError) as info:
        load_config(["+recipe=quickstart", "data.train_files=[mine.jsonl]"])
    assert str(info.value) == (
        "data.train_files/val_files are ignored while data.task=arithmetic makes the rows: set data.task="
    )
    with pytest.raises(ConfigError, match=r"^data.train_files lists a.jsonl more than once \(its rows trained on"):
        load_config(["+recipe=quickstart", "data.task=", "data.train_files=[a.jsonl,b.jsonl,a.jsonl]"])


def test_validation_rows_that_are_training_rows_are_said_not_held_out(tmp_path):
    """The same file, or a copy of it under another name (the re-check's n01): counted by prompt."""
    from rlpost.data.dataset import load_prompts
    from rlpost.data.row_warnings import overlap_warning
    from rlpost.tiny.model import build_char_tokenizer

    rows = ['{"prompt": "%d+1=", "ground_truth": "%d"}' % (i, i + 1) for i in range(4)]
    (tmp_path / "t.jsonl").write_text("\n".join(rows) + "\n")
    (tmp_path / "copy.jsonl").write_text("\n".join(rows[2:]) + "\n" + ROW)
    train, val = (load_prompts([str(tmp_path / f)], build_char_tokenizer(), 64).rows for f in ("t.jsonl", "copy.jsonl"))
    assert overlap_warning(train, val) == (
        "warning: 2 of the 3 validation prompts are training prompts too: the validation accuracy is not held out"
    )
    assert overlap_warning(train[:2], val) is None


def test_prompts_the_tokenizer_cannot_read_are_said(tmp_path):
    """'10→10=' for the tiny model: the arrow became its unknown token, and nothing was said."""
    from rlpost.data.dataset import load_prompts
    from rlpost.data.row_warnings import unknown_token_warning
    from rlpost.tiny.model import build_char_tokenizer

    tok = build_char_tokenizer()
    (tmp_path / "t.jsonl").write_text('{"prompt": "10→10=", "ground_truth": "20"}\n' + ROW)
    rows = load_prompts([str(tmp_path / "t.jsonl")], tok, 64).rows
    assert unknown_token_warning(rows, tok) == (
        f"warning: 1 prompts hold text that the tokenizer maps to its unknown token {tok.unk_token!r}, which the "
        "model cannot read (the first: '10→10=')"
    )
    assert unknown_token_warning(rows[1:], tok) is None


def test_data_files_as_spreadsheets_write_them(tmp_path):
    from rlpost.data.dataset import DataError, read_rows

    (tmp_path / "rows.csv").write_text("prompt;ground_truth\n1+2=;3\n")  # a locale's CSV export
    with pytest.raises(DataError) as info:
        read_rows(str(tmp_path / "rows.csv"))
    assert str(info.value) == (
        f"{tmp_path / 'rows.csv'}: its header 'prompt;ground_truth' is separated by ';', not ','; save the file with "
        "commas"
    )
    (tmp_path / "ROWS.JSONL").write_text(ROW)  # an upper-case extension
    assert read_rows(str(tmp_path / "ROWS.JSONL")) == [{"prompt": "1+2=", "ground_truth": "3"}]


def test_a_hub_data_set_without_a_network_is_named(monkeypatch):
    import datasets

    from rlpost.data.dataset import DataError, read_rows

    def offline(name, split):
        raise ConnectionError(f"Couldn't reach '{name}' on the Hub (LocalEntryNotFoundError)")

    monkeypatch.setattr(datasets, "load_dataset", offline)
    with pytest.raises(DataError, match=r"^openai/gsm8k: not a local file, and the hub could not be reached \("):
        read_rows("openai/gsm8k")


@pytest.mark.parametrize(
    "argv, said",
    [
        (
            ["train", "+recipe=quickstart", "trainer.total_steps==2"],
            "'trainer.total_steps==2': write KEY=VALUE, with one =",
        ),
        (["train", "+recipe=quickstart", "+recipe=dapo"], "one recipe a run: give +recipe=NAME once"),
        (["train", "+recipe=/somewhere/mine.yaml"], "+recipe= takes the name of a recipe in "),
        (["train", "+recipe=quickstart", "reward.kwargs=scale"], "in braces, its new keys with +: +KEY={name: value})"),
        (
            ["train", "+recipe=quickstart", "reward.kwargs={scale: 2}"],
            "'reward.kwargs': a mapping's new keys are added with +, as in +reward.kwargs={scale: 2}",
        ),
        (["train", "+recipe=quickstart", "trainer.total_steps=0"], "trainer.total_steps=0"),
        (
            ["train", "+recipe=quickstart", "trainer.optim.betas=[a,b]"],
            "betas=['a', 'b'] must be two numbers in [0, 1)",
        ),
        (
            ["eval", "runs/a"],
            "rlpost: unknown command 'eval'; the commands are train, data, export, plan, plot, doctor",
        ),
    ],
)
def test_command_line_slips_are_named_with_what_to_type(argv, said, capsys):
    from rlpost.cli import main

    assert main(argv) == 2
    err = capsys.readouterr().err
    assert said in err and "Traceback" not in err and "BRACKET_OPEN" not in err


def test_rlpost_data_into_a_path_under_a_file_is_named(tmp_path, capsys):
    from rlpost.cli import main

    (tmp_path / "ok.jsonl").write_text(ROW)
    assert main(["data", "arithmetic", "--out", str(tmp_path / "ok.jsonl" / "sub")]) == 2
    assert capsys.readouterr().err == (
        f"rlpost data: --out {tmp_path / 'ok.jsonl' / 'sub'}: cannot write there (Not a directory); choose another "
        "--out\n"
    )


def test_a_run_stopped_before_its_first_step_says_so_not_that_jsonl_is_off(tmp_path):
    from types import SimpleNamespace

    from rlpost.metrics.summary import write_report

    said = []
    write_report(tmp_path, 1.0, "none", SimpleNamespace(plot=False, backends=["console", "jsonl"]), said.append)
    write_report(tmp_path, 1.0, "none", SimpleNamespace(plot=False, backends=["console"]), said.append)
    assert "  metrics: none yet (no step ran)" in said[0].splitlines()
    assert "  metrics: none yet (no step ran)" in said[1].splitlines()
    (tmp_path / "metrics.jsonl").write_text('{"step": 0}\n{"step": 1, "reward/mean": 0.5}\n')
    write_report(tmp_path, 1.0, "none", SimpleNamespace(plot=False, backends=["tensorboard"]), said.append)
    # the tenth catalogue's t73: "none written (logger.backends has no jsonl)", though the file is always written
    assert f"  metrics: {tmp_path / 'metrics.jsonl'}" in said[2].splitlines()


def test_one_file_under_two_spellings_is_one_file(tmp_path, monkeypatch):
    """The re-check's n02: `d/t.jsonl` and `d/../d/t.jsonl` were two files to the check."""
    from rlpost.config import ConfigError, load_config

    monkeypatch.chdir(tmp_path)
    (tmp_path / "d").mkdir()
    with pytest.raises(ConfigError, match=r"^data.train_files lists d/../d/t.jsonl and d/t.jsonl, the same file \("):
        load_config(["+recipe=quickstart", "data.task=", "data.train_files=[d/t.jsonl,d/../d/t.jsonl]"])


def test_odd_files_of_rows_and_functions_are_named(tmp_path):
    from rlpost.data.dataset import DataError, read_rows

    (tmp_path / "t.parquet").write_bytes(b"PAR1 not really")
    with pytest.raises(DataError, match=rf"^{tmp_path / 't.parquet'}: not a readable parquet file \("):
        read_rows(str(tmp_path / "t.parquet"))
    (tmp_path / "a.jsonl").write_text('[{"prompt": "1+2=", "ground_truth": "3"}]\n')
    with pytest.raises(DataError, match=r"got list \(a file holding one JSON array is read as .json: rename it\)$"):
        from rlpost.data.dataset import load_prompts
        from rlpost.tiny.model import build_char_tokenizer

        load_prompts([str(tmp_path / "a.jsonl")], build_char_tokenizer(), 64)
    (tmp_path / "r.py").write_text("score = 1.0\n")
    with pytest.raises(AttributeError) as info:
        get_reward_fn(f"{tmp_path / 'r.py'}:score")
    assert str(info.value).endswith("r.py defines 'score' as a float, not a function")
