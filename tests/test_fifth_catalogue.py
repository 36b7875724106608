"""The fifth catalogue of bad inputs (issue 39), tried by someone who did not write the code:
checkpoints and run configs damaged or edited by hand, a reward file that holds the process open.
(The run folder's own logs: tests/controller/test_run_dir.py; the reward file's runs:
tests/rewards/test_user_file_runs.py.)"""

from __future__ import annotations

import json
import struct
import subprocess
import sys
import zipfile

import pytest
import torch

from rlpost.cli import main
from rlpost.config import ConfigError, load_config, to_yaml
from rlpost.controller import checkpoint
from rlpost.controller.setup import check_vocab, check_weights
from rlpost.data.dataset import DataError, PromptRow, read_rows
from rlpost.data.row_warnings import conflict_warning
from tests.helpers import save_tiny_model

QUICK = ["+recipe=quickstart"]


def saved_run(tmp_path, steps=(1, 2)):
    """A run folder with its config.yaml and intact checkpoints of `steps`."""
    run = tmp_path / "run"
    for step in steps:
        folder = run / "checkpoints" / f"step_{step}"
        (folder / "trainer").mkdir(parents=True)
        torch.save({"step": step}, folder / "controller.pt")
        (folder / "trainer" / "0.distcp").write_bytes(b"w" * 10)
        files = {p.relative_to(folder).as_posix(): p.stat().st_size for p in folder.rglob("*") if p.is_file()}
        (folder / checkpoint.MANIFEST).write_text(json.dumps(files))
    (run / "config.yaml").write_text(to_yaml(load_config([*QUICK, f"run.dir={run}"])))
    return run


@pytest.mark.parametrize("text", ['{"controller.pt": 12,', "\xff not utf-8", '["controller.pt"]'])
def test_a_manifest_that_is_not_json_is_damage_and_resume_goes_back_one(tmp_path, text):  # f05
    run = saved_run(tmp_path)
    (run / "checkpoints" / "step_2" / checkpoint.MANIFEST).write_bytes(text.encode("latin-1"))
    said = []
    assert checkpoint.find(run, "auto", log=said.append) == run / "checkpoints" / "step_1"
    assert said[0].startswith(f"checkpoint {run / 'checkpoints' / 'step_2'} is damaged (manifest.json is not ")
    with pytest.raises(FileNotFoundError, match=r"the checkpoint is damaged: manifest.json is not "):
        checkpoint.find(run, str(run / "checkpoints" / "step_2"))


def test_a_controller_state_damaged_at_the_same_size_is_found_by_its_checksums(tmp_path):  # f06
    run = saved_run(tmp_path)
    path = run / "checkpoints" / "step_2" / "controller.pt"
    data = bytearray(path.read_bytes())
    member = zipfile.ZipFile(path).infolist()[0]  # its local header: 30 bytes, then its name and extra field
    name_length, extra_length = struct.unpack("<HH", data[member.header_offset + 26 : member.header_offset + 30])
    data[member.header_offset + 30 + name_length + extra_length] ^= 0xFF  # its first byte: the size is the manifest's
    path.write_bytes(bytes(data))
    said = []
    assert checkpoint.find(run, "auto", log=said.append) == run / "checkpoints" / "step_1"
    assert "controller.pt is damaged (" in said[0] and "fails its checksum)" in said[0]
    for i in range(0, len(data), 7):  # the catalogue's: every 7th byte, the zip's own headers too
        data[i] ^= 0xFF
    path.write_bytes(bytes(data))
    assert checkpoint.damage(path.parent) == "controller.pt is not a readable torch file"


def test_a_controller_state_that_cannot_be_read_at_load_names_the_one_before(tmp_path, monkeypatch):
    run = saved_run(tmp_path)
    monkeypatch.setattr(torch, "load", lambda *a, **k: (_ for _ in ()).throw(RuntimeError("invalid header\nmore")))
    with pytest.raises(checkpoint.CheckpointError) as info:
        checkpoint.load(run / "checkpoints" / "step_2", [])
    assert str(info.value) == (
        f"checkpoint {run / 'checkpoints' / 'step_2'}: controller.pt could not be read (RuntimeError: invalid header); "
        f"trainer.resume=auto passes over it, to {(run / 'checkpoints' / 'step_1').resolve()}"
    )


def test_a_run_config_edited_by_hand_is_named_on_resume_and_on_export(tmp_path, capsys):  # f07, c04
    run = saved_run(tmp_path)
    path = run / "config.yaml"
    path.write_text(path.read_text().replace("trainer:\n", "trainer:\n  totl_steps: 5\n", 1))
    cfg = load_config([*QUICK, f"run.dir={run}", "trainer.resume=auto", "trainer.total_steps=4"])
    with pytest.raises(ConfigError) as info:
        checkpoint.check_resume(cfg, run)
    assert str(info.value).startswith(f"{path}: not a config rlpost can read (trainer.totl_steps): ")
    assert str(info.value).endswith(
        "(did you mean trainer.total_steps?); it is the run's own record of its settings: undo the edit"
    )
    assert main(["export", str(run), "--out", str(tmp_path / "out")]) == 2
    said = capsys.readouterr().err
    assert said.startswith(f"rlpost export: {path}: not a config rlpost can read (trainer.totl_steps)")


def test_a_reward_file_with_a_thread_that_never_ends_does_not_hold_the_command(tmp_path):  # r04
    """A non-daemon thread started at import kept `rlpost` from exiting after its summary: the
    file ran in the command's own process. Now the command only reads it (here: `--cfg job`,
    which checks reward.fn as a run does; the old code hung here) and the reward workers that run
    it are killed at the end."""
    reward = tmp_path / "r_thread.py"
    reward.write_text(
        "import threading, time\nthreading.Thread(target=lambda: time.sleep(3600)).start()\n"
        "def score(sample):\n    return 1.0\n"
    )
    command = [sys.executable, "-m", "rlpost.cli", "train", *QUICK, f"reward.fn={reward}:score", "--cfg", "job"]
    done = subprocess.run(command, capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr


@pytest.mark.parametrize("keep", [10_000, 40])  # within the data; within the header
def test_model_weights_cut_short_are_named_before_any_actor(tmp_path, keep):  # m01
    save_tiny_model(tmp_path, hidden=32, layers=2, intermediate=64)
    weights = tmp_path / "model.safetensors"
    size = weights.stat().st_size
    with open(weights, "r+b") as f:
        f.truncate(keep)
    cfg = load_config([*QUICK, f"model.path={tmp_path}"])
    with pytest.raises(ConfigError) as info:
        check_weights(cfg, str(tmp_path))
    said = str(info.value)
    assert said.startswith(f"model.path='{tmp_path}': {weights} ") and said.endswith("; fetch or copy it again")
    if keep == 10_000:
        assert f"is cut short: 10000 bytes, its header needs {size}" in said
    else:
        assert "has no readable safetensors header (40 bytes)" in said


def test_an_intact_model_passes_the_weight_checks(tmp_path):
    save_tiny_model(tmp_path, hidden=32, layers=2, intermediate=64)
    check_weights(load_config([*QUICK, f"model.path={tmp_path}"]), str(tmp_path))


def test_a_tokenizer_of_a_larger_vocabulary_is_refused_before_the_first_generation(tmp_path):  # m03
    _, tok = save_tiny_model(tmp_path, hidden=32, layers=2, intermediate=64)
    vocab = json.loads((tmp_path / "config.json").read_text())["vocab_size"]
    cfg = load_config([*QUICK, f"model.path={tmp_path}"])
    rows = [PromptRow([1, 2, vocab - 1], "a", "1", "arithmetic")]
    check_vocab(cfg, tok, str(tmp_path), rows)  # the largest id the model has: fine
    rows.append(PromptRow([3, vocab + 199], "b", "2", "arithmetic"))
    with pytest.raises(ConfigError) as info:
        check_vocab(cfg, tok, str(tmp_path), rows)
    assert str(info.value) == (
        f"model.path='{tmp_path}': the tokenizer in {tmp_path} gives token id {vocab + 199}, but the model has "
        f"{vocab} (vocab_size in config.json): the tokenizer is another model's; give the model's own"
    )


def test_prompts_with_contradicting_ground_truths_are_said(tmp_path):  # d03
    rows = [PromptRow([1], f"{a}+1=", str(a + 1), "arithmetic") for a in range(5)]
    assert conflict_warning(rows + rows) is None  # the same answer twice: a duplicate, not a contradiction
    shifted = [PromptRow([1], f"{a}+1=", str(a + 2), "arithmetic") for a in range(3)]
    assert conflict_warning(rows + shifted) == (
        "warning: 3 training prompts appear with different ground truths, so the reward contradicts itself on "
        "them (the first: '0+1=' with '1', '2')"
    )


def test_a_plan_for_a_gpu_smaller_than_the_cuda_contexts_names_the_size(capsys):  # c11
    assert main(["plan", *QUICK, "trainer.device=cuda", "--gpu-gb", "0.001"]) != 0
    said = capsys.readouterr().err.strip()
    assert said.endswith(
        "a GPU of 0.001 GiB (`rlpost plan --gpu-gb`, or the GPU found) does not hold even the CUDA contexts "
        "(2 GiB): give the GPU's memory in GiB"
    )


def test_a_wildcard_in_a_data_path_says_it_is_not_expanded(tmp_path):  # d11
    for name in ("a.jsonl", "b.jsonl"):
        (tmp_path / name).write_text('{"prompt": "1+1=", "ground_truth": "2"}\n')
    with pytest.raises(DataError) as info:
        read_rows(str(tmp_path / "*.jsonl"))
    assert str(info.value) == (
        f"{tmp_path}/*.jsonl: no such file (wildcards are not expanded: list the files, e.g. "
        f"[{tmp_path}/a.jsonl,{tmp_path}/b.jsonl])"
    )
    with pytest.raises(DataError, match=r"missing.jsonl: no such file$"):
        read_rows(str(tmp_path / "missing.jsonl"))


def test_a_json_file_of_columns_is_named_with_the_records_layout(tmp_path):  # d12
    path = tmp_path / "columns.json"
    path.write_text(json.dumps({"prompt": {"0": "1+1=", "1": "2+2="}, "ground_truth": {"0": "2", "1": "4"}}))
    with pytest.raises(DataError) as info:
        read_rows(str(path))
    assert str(info.value) == (
        f"{path}: one JSON object of columns (pandas' DataFrame.to_json() default), not rows; write records: "
        "df.to_json(path, orient='records', lines=True) as .jsonl"
    )
    path.write_text(json.dumps({"prompt": [{"role": "user", "content": "hi"}], "ground_truth": "2"}))  # one row
    assert read_rows(str(path)) == [{"prompt": [{"role": "user", "content": "hi"}], "ground_truth": "2"}]


def test_a_bool_score_says_how_to_return_a_number():  # r05
    from rlpost.rewards.values import BadValue, checked

    with pytest.raises(BadValue) as info:
        checked(True)
    assert str(info.value) == "returned True (bool), not a finite number (return float(True) for a score)"
    with pytest.raises(BadValue) as info:
        checked("yes")
    assert str(info.value) == "returned 'yes' (str), not a finite number"


def test_a_response_cap_that_cannot_hold_the_answer_is_said_before_the_first_step():  # a17
    from rlpost.data.row_warnings import short_cap_warning
    from rlpost.tiny.model import build_char_tokenizer

    tok = build_char_tokenizer()
    rows = [PromptRow([1], "12+56=", "0068", "arithmetic"), PromptRow([1], "1+1=", "2", "arithmetic")]
    assert short_cap_warning(rows, tok, 5) is None  # 4 characters and the eos
    assert short_cap_warning(rows, tok, 2) == (
        "warning: rollout.max_response_length=2 tokens cannot hold the longest ground truth ('0068': 5 tokens with "
        "the eos); raise it, or those rows score nothing"
    )


def test_a_row_in_verls_layout_says_where_the_ground_truth_goes():  # d07
    from rlpost.data.dataset import check_row

    row = {"prompt": "1+1=", "data_source": "x", "reward_model": {"style": "rule", "ground_truth": "2"}}
    with pytest.raises(DataError) as info:
        check_row(row, "d.jsonl: row 0")
    assert str(info.value) == (
        "d.jsonl: row 0: field 'ground_truth' is missing (fields present: ['data_source', 'prompt', 'reward_model']); "
        "verl's layout: write reward_model.ground_truth as a top-level ground_truth"
    )


def test_a_key_given_twice_is_said_with_both_values(capsys):  # a15
    from rlpost.config.command_line import repeated_keys

    assert repeated_keys(["trainer.total_steps=2", "+recipe=quickstart", "trainer.total_steps=3", "run.seed=1"]) == [
        "trainer.total_steps given 2 times (2, 3): the last, 3, is used"
    ]
    assert repeated_keys(["a.b=1", "a.c=1"]) == []
    assert main(["train", *QUICK, "trainer.total_steps=2", "trainer.total_steps=3", "--cfg", "job"]) == 0
    captured = capsys.readouterr()
    assert captured.err == "rlpost: trainer.total_steps given 2 times (2, 3): the last, 3, is used\n"
    assert "total_steps: 3" in captured.out


def test_an_override_with_no_value_says_so(capsys):  # a01
    assert main(["train", *QUICK, "trainer.total_steps=", "--cfg", "job"]) == 2
    said = capsys.readouterr().err
    assert "trainer.total_steps=" in said
    hint = "(the override gives the key no value: write KEY=VALUE, or KEY=null where null is allowed)"
    assert said.rstrip().endswith(hint)


def test_a_critic_of_a_smaller_vocabulary_is_refused_before_the_actors(tmp_path):
    """The ninth catalogue's n30: it passed the start and died at step 1 with an IndexError, said as
    "a Ray worker died"."""
    _, tok = save_tiny_model(tmp_path / "policy", hidden=32, layers=2, intermediate=64)
    save_tiny_model(tmp_path / "critic", hidden=32, layers=2, intermediate=64)
    vocab = json.loads((tmp_path / "policy" / "config.json").read_text())["vocab_size"]
    rows = [PromptRow([1, 2], "a", "1", "arithmetic")]
    cfg = load_config(["+recipe=ppo", f"model.path={tmp_path / 'policy'}", f"critic.model_path={tmp_path / 'critic'}"])
    check_vocab(cfg, tok, str(tmp_path / "policy"), rows)  # the same vocabulary: fine
    config = json.loads((tmp_path / "critic" / "config.json").read_text())
    (tmp_path / "critic" / "config.json").write_text(json.dumps({**config, "vocab_size": vocab - 8}))
    with pytest.raises(ConfigError, match=rf"has {vocab - 8} tokens \(vocab_size\), the policy {vocab}: the critic"):
        check_vocab(cfg, tok, str(tmp_path / "policy"), rows)
