"""Faults the sixteenth bad-input catalogue found (179 tries by someone who did not write the code, on
2b9f08a onwards: FINE 152, WEAK 21, TRACEBACK 1, LATE 1, LOSS 2, SILENT 2, HANG 0): each test here fails
on the code before its fix. Here: t07, t11, t32, t37, t43, t44, t62, t73, t89, t101, t104, t114-t116,
t120-t121, t128-t130, t142, t148, t160, t174, t176, t179. Beside the code they test: t88 and t141 (the
overwrite of wandb/, tensorboard/ and profile/) in tests/controller/test_run_dir.py."""

import json

import pytest

from rlpost.config import ConfigError, load_config
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


def test_a_ground_truth_with_spaces_around_it_is_measured_as_the_answer_the_scorers_compare():
    """t11: ground truths written "130 " (a padded CSV export) drew "cannot hold the longest ground
    truth ... raise it", yet the scorers strip them and the rows scored as usual."""
    from rlpost.data.dataset import PromptRow
    from rlpost.data.row_warnings import short_cap_warning
    from rlpost.tiny.model import build_char_tokenizer

    tok = build_char_tokenizer()
    rows = [PromptRow([1], "60+70=", " 130 ", "arithmetic"), PromptRow([1], "1+1=", "2\n", "arithmetic")]
    assert short_cap_warning(rows, tok, 4) is None  # 3 characters and the eos
    assert short_cap_warning(rows, tok, 3) == (
        "warning: rollout.max_response_length=3 tokens cannot hold the longest ground truth ('130': 4 tokens with "
        "the eos); raise it, or those rows score nothing"
    )


ALARMS = """
import signal, time

class Own(Exception):
    pass

def score(sample):
    if sample.response == "hang":  # no alarm of its own: only the pool's can end it
        time.sleep(3600)
    def ring(signum, frame):
        raise Own()
    old = signal.signal(signal.SIGALRM, ring)  # a guard of its own, as timeout decorators do
    signal.alarm(5)
    try:
        if sample.response == "slow":
            time.sleep(1.0)
            return 0.0
        return 1.0
    finally:
        signal.alarm(0)  # cancels the real-time timer: the pool's too
        signal.signal(signal.SIGALRM, old)
"""


@pytest.mark.timeout(120)
def test_a_reward_that_takes_the_alarm_itself_still_has_its_slow_samples_and_the_next_ones_cut(tmp_path, capsys):
    """t32: a reward with a SIGALRM guard of its own replaced the pool's handler and cancelled its timer:
    samples past reward.timeout_s scored as ordinary ones (reward/timeouts 0), a later hang waited for the
    parent's backstop (the worker killed, its share scored again), and the message blamed native code."""
    from rlpost.rewards import RewardInput
    from rlpost.rewards.pool import RewardPool

    path = tmp_path / "alarms.py"
    path.write_text(ALARMS)
    pool = RewardPool(f"{path}:score", {}, 1, 0.3, 1024, -1.0)
    try:
        out = pool.score([RewardInput("3+4=", r, "7", "arithmetic") for r in ("slow", "ok", "hang", "ok")])
    finally:
        pool.close()
    assert out.scores == [-1.0, 1.0, -1.0, 1.0] and out.counts["timeouts"] == 2
    assert out.first_error == (
        "sample 0: timed out after reward.timeout_s=0.3 (reward.fn set SIGALRM's handler or timer itself "
        "(signal.alarm, setitimer or signal.signal), which replaces the pool's alarm: it ran on past the limit; "
        "leave timeouts to reward.timeout_s)"
    )
    assert "did not answer" not in capsys.readouterr().out  # the hang was cut by the pool's alarm, set again


def test_a_full_disk_at_the_end_is_a_line_of_the_summary_not_a_traceback_of_a_finished_run(tmp_path, monkeypatch):
    """t37: on a nearly full disk the run trained, then drawing curves.png raised (71 lines, exit 1) and
    the summary was never printed; summary.json itself may not fit either."""
    import errno
    from types import SimpleNamespace

    from rlpost.metrics import plot
    from rlpost.metrics.summary import write_report

    rows = [{"step": 0, "val/accuracy": 0.5}, {"step": 1, "reward/mean": 0.25, "timing_s/step": 1.0}]
    (tmp_path / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))

    def full(dirs, *args, **kwargs):
        raise OSError(errno.ENOSPC, "No space left on device", str(tmp_path / "curves.png"))

    monkeypatch.setattr(plot, "plot_runs", full)
    said = []
    summary = write_report(tmp_path, 5.0, "none", SimpleNamespace(plot=True), said.append)
    assert summary["steps"] == 1 and json.loads((tmp_path / "summary.json").read_text()) == summary
    curves = f"  curves: not drawn (No space left on device: {tmp_path / 'curves.png'}); draw it later: rlpost plot"
    assert curves in said[0]
    (tmp_path / "summary.json").unlink()
    (tmp_path / "summary.json").mkdir()  # cannot be written
    said.clear()
    write_report(tmp_path, 5.0, "none", SimpleNamespace(plot=False), said.append)
    assert f"  summary: not written (Is a directory: {tmp_path / 'summary.json'})" in said[0]


@pytest.mark.parametrize(
    "words, said",
    [
        (
            ["trainer.total_steps", "=", "2"],
            "'trainer.total_steps = 2': write KEY=VALUE as one word, without spaces around '=': trainer.total_steps=2",
        ),
        (
            ["trainer.total_steps", "=2"],
            "'trainer.total_steps =2': write KEY=VALUE as one word, without spaces around '=': trainer.total_steps=2",
        ),
        (
            ["trainer.total_steps=", "2"],
            "'trainer.total_steps= 2': write KEY=VALUE as one word, without spaces around '=': trainer.total_steps=2",
        ),
        (
            ["trainer.optim.lr=1e\u22124"],
            "'trainer.optim.lr=1e\u22124': '\u2212' (U+2212 MINUS SIGN) is not the ASCII "
            "'-', as text copied from a paper or a word processor has it: type trainer.optim.lr=1e-4",
        ),
        (
            ["data.train_files=[rows.jsonl,]"],
            "'data.train_files=[rows.jsonl,]': a list's items are separated by "
            "single commas, with none before ] or after [: data.train_files=[rows.jsonl]",
        ),
        (["run.dir='abc"], "\"run.dir='abc\": the quote ' opened in its value is not closed: run.dir='abc'"),
    ],
)
def test_a_slip_of_typing_on_the_command_line_is_named_as_such(words, said):
    """t43: `KEY = VALUE` (three words to the shell), t44: a Unicode minus pasted into `1e−4`, t104: a
    list's trailing comma and t142: a quote left open were told to quote a value, which would not help."""
    with pytest.raises(ConfigError) as info:
        load_config(["+recipe=quickstart", *words])
    assert str(info.value) == said


def test_a_world_size_that_does_not_divide_the_batch_names_the_keys_in_effect_and_what_fits():
    """t62: with algo.ppo_mini_batch_size=0 (the whole batch) the message read "algo.ppo_mini_batch_size *
    rollout.n = 512" (0 x 8 = 512) and gave no way on; and t73: cluster.stall_timeout_s=0.001 was taken,
    then stopped the run once Ray and the actors were up."""
    with pytest.raises(ConfigError) as info:
        load_config(["+recipe=quickstart", "trainer.world_size=3"])
    assert str(info.value) == (
        "each optimizer step sees data.train_batch_size=64 (algo.ppo_mini_batch_size=0: the whole batch) x "
        "rollout.n=8 = 512 sequences, which trainer.world_size=3 does not divide: use 1, 2, 4 ranks, or a batch 3 "
        "divides"
    )
    with pytest.raises(ConfigError, match=r"^cluster.stall_timeout_s=0.001 must be >= 60$"):
        load_config(["+recipe=quickstart", "cluster.stall_timeout_s=0.001"])


def test_a_reward_returning_an_integer_beyond_a_float_is_too_large_not_an_error_it_never_raised():
    """t89: `10**400` for a right answer was counted as the function raising OverflowError (an int beyond
    a float's range made the check itself raise), warned on the first try, and trained nothing."""
    from rlpost.data.scalars import finite_number
    from rlpost.rewards.values import BadValue, checked

    assert finite_number(10**400) is None and finite_number(-(10**400)) is None
    with pytest.raises(BadValue) as info:
        checked(10**400)
    assert str(info.value) == (
        "returned an integer of 401 digits, beyond +-1e+19: rewards are computed in float32, whose losses overflow "
        "there and train nothing; scale the reward down"
    )
    with pytest.raises(BadValue, match=r"^returned -1e\+30, beyond"):
        checked(-(10**30))
    assert checked(10**18) == 1e18


def test_a_hub_model_missing_from_the_cache_under_hf_hub_offline_is_said_as_such(tmp_path, monkeypatch):
    """t101: with HF_HUB_OFFLINE=1 and the model not cached, `rlpost train` said the model "has no
    tokenizer" and advised setting HF_HUB_OFFLINE=1 (set); `rlpost plan` said "no config.json there"."""
    import huggingface_hub
    from huggingface_hub import constants

    from rlpost.controller.plan import model_shape
    from rlpost.models.loading import check_hub_reachable

    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", True)
    monkeypatch.setattr(huggingface_hub, "try_to_load_from_cache", lambda repo, name: None)
    said = (
        "the model 'org/not-cached' is not a local folder nor in the Hugging Face cache, and HF_HUB_OFFLINE=1 is "
        "set, so the hub is not asked: give a local folder with the model's files, or download it where there is a "
        "network (`huggingface-cli download org/not-cached` fills the cache), or unset HF_HUB_OFFLINE"
    )
    for check in (check_hub_reachable, model_shape):
        with pytest.raises(FileNotFoundError) as info:
            check("org/not-cached")
        assert str(info.value) == said
    config = tmp_path / "config.json"  # cached: the plan reads the shape from the cache
    config.write_text(json.dumps({"hidden_size": 64, "num_hidden_layers": 2, "num_attention_heads": 4,
                                  "intermediate_size": 128, "vocab_size": 100}))  # fmt: skip
    monkeypatch.setattr(huggingface_hub, "try_to_load_from_cache", lambda repo, name: str(config))
    assert model_shape("org/cached").hidden == 64


def test_a_tab_separated_csv_a_git_lfs_pointer_and_a_pipe_are_named_for_what_they_are(tmp_path):
    """t114: a tab-separated .csv was refused as "field 'prompt' is missing" (';' was named already);
    t115, t116: a Git LFS pointer in place of the data (cloned without git-lfs) was "not valid JSON" or "not
    a readable parquet file ...; write it again"; t120, t121: /dev/stdin and /dev/zero were "no such file"."""
    import os

    tsv = tmp_path / "rows.csv"
    tsv.write_text("prompt\tground_truth\n1+1=\t2\n")
    with pytest.raises(DataError) as info:
        read_rows(str(tsv))
    assert str(info.value) == (
        f"{tsv}: its header 'prompt\\tground_truth' is separated by tabs, not ','; save the file with commas"
    )
    pointer = "version https://git-lfs.github.com/spec/v1\noid sha256:4d7a\nsize 123456\n"
    for name in ("train.jsonl", "train.parquet"):
        (tmp_path / name).write_text(pointer)
        with pytest.raises(DataError) as info:
            read_rows(str(tmp_path / name))
        assert str(info.value) == (
            f"{tmp_path / name}: a Git LFS pointer, not the data (a repository cloned without git-lfs): fetch the "
            "file (git lfs pull) or download it"
        )
    fifo = tmp_path / "rows"
    os.mkfifo(fifo)  # what /dev/stdin is when rows are piped in
    for path in (str(fifo), "/dev/zero"):
        with pytest.raises(DataError, match=r": not a regular file \(a pipe or a device\): save the rows to a file$"):
            read_rows(path)


def test_a_relative_tmpdir_is_refused_before_ray_and_a_deleted_working_folder_before_torch(tmp_path, monkeypatch):
    """t128: TMPDIR=reltmp (a folder in the working directory) crashed Ray's raylet at start, blamed on the
    out-of-memory killer or a busy machine; t129: from a deleted working directory torch's import died in
    "Intel oneMKL FATAL ERROR: Cannot load libtorch_cpu.so"."""
    import os
    import subprocess
    import sys

    from rlpost.controller.ray_checks import check_ray_can_start

    monkeypatch.chdir(tmp_path)
    (tmp_path / "reltmp").mkdir()
    monkeypatch.delenv("RAY_TMPDIR", raising=False)
    monkeypatch.setenv("TMPDIR", "reltmp")
    with pytest.raises(ConfigError) as info:
        check_ray_can_start()
    assert str(info.value) == (
        "TMPDIR='reltmp' is a relative path, which Ray cannot keep its sessions and sockets under (its raylet stops "
        f"as it starts): give an absolute folder, e.g. TMPDIR={tmp_path / 'reltmp'}"
    )
    monkeypatch.setenv("TMPDIR", "/tmp")  # absolute: no refusal of this kind
    check_ray_can_start()
    gone = tmp_path / "gone"
    gone.mkdir()
    code = "import os; os.rmdir(os.getcwd()); from rlpost.cli import main; raise SystemExit(main(['train']))"
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)}
    out = subprocess.run([sys.executable, "-c", code], cwd=gone, env=env, capture_output=True, text=True, timeout=60)
    assert (out.returncode, out.stderr.strip().splitlines()[-1]) == (
        2,
        "rlpost: the working directory no longer exists (deleted or moved); cd to a folder that exists and run it "
        "again",
    )


def test_prompts_holding_the_padding_tokens_text_are_said_before_the_first_step():
    """t148: prompts written "<pad>13+21=" (scraped or templated text carries such tokens literally) were
    read with a padding token in front, and only the symptoms were warned (every response cut, every
    reward the same), with advice to raise the response cap."""
    from rlpost.data.dataset import PromptRow
    from rlpost.data.row_warnings import unknown_token_warning
    from rlpost.tiny.model import build_char_tokenizer

    tok = build_char_tokenizer()
    ids = lambda text: tok(text, add_special_tokens=False).input_ids  # noqa: E731
    rows = [PromptRow(ids(t), t, "34", "arithmetic") for t in ("13+21=", "<pad>13+21=", "<pad>1+1=")]
    assert unknown_token_warning(rows[:1], tok) is None
    assert unknown_token_warning(rows, tok) == (
        "warning: 2 prompts hold the text of the tokenizer's padding token '<pad>', read as that token, a padding "
        "the model never learned to read (the first: '<pad>13+21='): take it out of the prompts"
    )


def test_a_run_folder_whose_config_yaml_went_names_its_checkpoints_and_the_way_on(tmp_path):
    """t160: a copy of a run without its config.yaml was said to hold files "that no rlpost run wrote",
    and the resume asked for was given no way on."""
    from rlpost.controller import checkpoint
    from rlpost.controller.run_dir import claim_run_dir

    for step in (3, 4):
        checkpoint.save(tmp_path, step, {"step": step}, [], keep=5)
    (tmp_path / "metrics.jsonl").write_text('{"step": 0}\n{"step": 4}\n')
    cfg = load_config(["+recipe=quickstart", f"run.dir={tmp_path}", "trainer.resume=auto", "trainer.total_steps=6"])
    with pytest.raises(ConfigError) as info:
        claim_run_dir(cfg, log=lambda *_: None)
    assert str(info.value) == (
        f"run.dir={str(tmp_path)!r} holds a run's checkpoints (step_3, step_4) and metrics.jsonl, but not its "
        f"config.yaml (deleted, or not copied): put config.yaml back to go on here, or go on in a new folder: "
        f"trainer.resume={tmp_path / 'checkpoints' / 'step_4'} run.dir=NEW"
    )


def test_a_prompt_of_spaces_is_refused_and_a_long_decimal_ground_truth_keeps_its_digits(tmp_path):
    """t130: a prompt of spaces only was trained on without a word (an empty one is refused); t179: a
    JSON ground truth with more digits than a float keeps reached the scorer changed
    (123456789012345678.9 -> '123456789012345680')."""
    from rlpost.data.dataset import check_row, load_prompts
    from rlpost.tiny.model import build_char_tokenizer

    path = tmp_path / "rows.jsonl"
    path.write_text(
        '{"prompt": "1+1=", "ground_truth": 123456789012345678.9, "weight": 0.5}\n'
        '{"prompt": "1+2=", "ground_truth": 1.10}\n{"prompt": "1+3=", "ground_truth": 123.0}\n'
    )
    rows = read_rows(str(path))
    assert [check_row(r, "x")["ground_truth"] for r in rows] == ["123456789012345678.9", "1.1", "123"]
    assert rows[0]["weight"] == 0.5 and isinstance(rows[0]["weight"], float)  # other fields: floats as before
    path.write_text('{"prompt": "1+1=", "ground_truth": "2"}\n{"prompt": "   ", "ground_truth": "3"}\n')
    with pytest.raises(DataError, match=r"rows.jsonl: row 1: field 'prompt' is empty \(spaces only\)$"):
        load_prompts([str(path)], build_char_tokenizer(), 64)


def test_a_resume_given_a_runs_checkpoints_folder_or_a_part_of_a_checkpoint_names_the_checkpoint(tmp_path):
    """t174, t176: `trainer.resume=` a run's checkpoints/ folder, or a checkpoint's trainer/ folder, said
    only "not a complete checkpoint (no controller.pt)"."""
    from rlpost.controller import checkpoint

    for step in (2, 4):
        checkpoint.save(tmp_path, step, {"step": step}, [], keep=5)
    (tmp_path / "checkpoints" / "step_4" / "trainer").mkdir()
    newest = tmp_path / "checkpoints" / "step_4"
    for given, hint in (
        (
            tmp_path / "checkpoints",
            f"a run's checkpoints folder: give one of them, e.g. the newest, trainer.resume={newest}",
        ),  # fmt: skip
        (newest / "trainer", f"a part of the checkpoint {newest}: give that folder"),
    ):
        with pytest.raises(FileNotFoundError) as info:
            checkpoint.find(tmp_path, str(given))
        assert str(info.value) == (
            f"trainer.resume={given}: {given} is not a complete checkpoint (no controller.pt) ({hint})"
        )
