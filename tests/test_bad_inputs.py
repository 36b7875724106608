"""The catalogue of bad inputs and faults, each with the exact outcome a user sees: an error that
names the key, file, row or sample at fault, a counted skip, or a recovered run. Faults that need
a whole run (signals, actors killed, a full disk, a damaged checkpoint, a hanging reward through
the controller) are in tests/integration/test_signals.py and test_reliability.py; here the same
outcomes at the level that decides them, quickly. Nothing may hang: every test has a timeout."""

import json
import os
import re
import signal
import socket
import time

import pytest
import torch

from rlpost.config import ConfigError, load_config
from rlpost.controller import checkpoint
from rlpost.controller.setup import check_reward_routing
from rlpost.data.dataset import DataError, PromptLoader, PromptRow, load_prompts
from rlpost.rewards import RewardInput, get_reward_fn
from rlpost.rewards.pool import RewardPool
from rlpost.tiny.model import build_char_tokenizer
from tests.helpers import controller_bytes

pytestmark = pytest.mark.timeout(60)

# ------------------------------------------------------------------------------------ config
CONFIG = [
    ("trainer.optim.lr=-1", "trainer.optim.lr=-1.0 must be >= 0"),
    ("algo.gamma=1.5", "algo.gamma=1.5 must be <= 1"),
    ("algo.clip_ratio_low=1.0", "algo.clip_ratio_low=1.0 must be < 1"),
    ("trainer.world_size=0", "trainer.world_size=0 must be >= 1"),
    ("rollout.n=0", "rollout.n=0 must be >= 1"),
    ("reward.timeout_s=0", "reward.timeout_s=0.0 must be > 0"),
    ("reward.max_error_fraction=1.5", "reward.max_error_fraction=1.5 must be <= 1"),
    (
        "trainer.wrold_size=2",
        "unknown config key 'trainer.wrold_size'; did you mean: trainer.world_size, trainer.profile_step, "
        "trainer.micro_batch_size?",
    ),
    (
        "trainer.total_steps=abc",
        "Error merging override trainer.total_steps=abc: Value 'abc' of type 'str' could not be converted to Integer",
    ),
    (
        "algo.name=nope",
        "algo.name='nope' is not a registered algorithm; choose one of ['grpo', 'ppo', 'rloo', 'reinforce_pp', "
        "'reinforce_pp_baseline', 'dapo', 'gspo', 'cispo']",
    ),
    (
        "model.path=/no/such/folder",
        "model.path='/no/such/folder': no such file or folder (a hub id looks like `org/name`)",
    ),
    ("critic.model_path=./nope", "critic.model_path='./nope': no such file or folder (a hub id looks like `org/name`)"),
    ("trainer.resume=/no/such/ckpt", "trainer.resume='/no/such/ckpt': not `none`, `auto` or an existing folder"),
    (
        "algo.overlong_buffer=4",
        "algo.overlong_buffer=4 must be shorter than rollout.max_response_length=4: the penalty ramps over the "
        "last tokens before the limit",
    ),
    (
        "reward.rule_weight=0",
        "reward.rule_weight=0 and no weighted reward model (reward.model.path, reward.model.weight): every "
        "sample would score 0",
    ),
]


@pytest.mark.parametrize("override, message", CONFIG, ids=[o for o, _ in CONFIG])
def test_a_bad_setting_stops_before_anything_starts_naming_its_key(override, message):
    with pytest.raises(ConfigError) as info:
        load_config(["+recipe=quickstart", override])
    assert str(info.value) == message


def test_a_causal_lm_reward_model_without_its_function():
    with pytest.raises(ConfigError, match=r"^reward.model.kind=causal_lm needs reward.model.score_fn="):
        load_config(["+recipe=quickstart", "reward.model.path=tiny", "reward.model.kind=causal_lm"])


# ---------------------------------------------------------------------------------- reward.fn
def test_an_unknown_reward_name():
    with pytest.raises(KeyError, match=r"reward.fn='nope' is not a registered reward; choose one of"):
        get_reward_fn("nope")


def test_a_reward_file_that_is_not_there(tmp_path):
    with pytest.raises(FileNotFoundError, match=r"no file .*missing.py"):
        get_reward_fn(f"{tmp_path}/missing.py:f")


def test_a_reward_file_without_the_function(tmp_path):
    (tmp_path / "r.py").write_text("x = 1\n")
    with pytest.raises(AttributeError, match=r"r.py defines no function 'f'"):
        get_reward_fn(f"{tmp_path}/r.py:f")


# --------------------------------------------------------------------------------------- data
@pytest.fixture(scope="module")
def tok():
    return build_char_tokenizer()


def write(tmp_path, lines, name="d.jsonl"):
    path = tmp_path / name
    path.write_text("".join(line + "\n" for line in lines))
    return str(path)


def test_a_data_file_that_is_not_there(tmp_path, tok):
    with pytest.raises(DataError, match=r"missing.jsonl: no such file$"):
        load_prompts([str(tmp_path / "missing.jsonl")], tok, 64)


def test_a_data_file_that_is_a_link_to_nowhere(tmp_path, tok):
    """The ninth catalogue's n15: a symbolic link in a loop was reported as "no such file"."""
    (tmp_path / "loop.jsonl").symlink_to(tmp_path / "loop.jsonl")
    with pytest.raises(DataError, match=r"loop.jsonl: a symbolic link that leads nowhere \(in a loop"):
        load_prompts([str(tmp_path / "loop.jsonl")], tok, 64)


def test_a_row_that_is_not_json(tmp_path, tok):
    path = write(tmp_path, ['{"prompt": "1+1=", "ground_truth": "2"}', "{oops"])
    with pytest.raises(DataError, match=r"d.jsonl: row 1: not valid JSON"):
        load_prompts([path], tok, 64)


def test_a_row_with_a_key_given_twice(tmp_path, tok):
    """The ninth catalogue's n12: json keeps the last of a duplicated key without a word."""
    path = write(tmp_path, ['{"prompt": "1+1=", "ground_truth": "2"}', '{"prompt": "1+2=", "ground_truth": "3", '
                            '"ground_truth": "4"}'])  # fmt: skip
    with pytest.raises(DataError, match=r"d.jsonl: row 1: the key 'ground_truth' is given twice; give each key once"):
        load_prompts([path], tok, 64)


def test_a_row_without_ground_truth(tmp_path, tok):
    path = write(tmp_path, ['{"prompt": "1+1="}'])
    with pytest.raises(DataError, match=r"d.jsonl: row 0: field 'ground_truth' is missing"):
        load_prompts([path], tok, 64)


def test_an_empty_prompt(tmp_path, tok):
    path = write(tmp_path, ['{"prompt": "", "ground_truth": "2"}'])
    with pytest.raises(DataError, match=r"d.jsonl: row 0: field 'prompt' is empty"):
        load_prompts([path], tok, 64)


def test_a_file_whose_every_prompt_is_too_long(tmp_path, tok):
    path = write(tmp_path, [json.dumps({"prompt": "1+" * 20 + "1=", "ground_truth": "21"})] * 3)
    with pytest.raises(DataError) as info:
        load_prompts([path], tok, 16)
    assert str(info.value) == (
        f"{path}: every prompt is longer than data.max_prompt_length=16 tokens (the shortest has 42); "
        "raise data.max_prompt_length"
    )


def test_some_prompts_too_long_are_dropped_and_counted(tmp_path, tok):
    path = write(
        tmp_path, ['{"prompt": "1+1=", "ground_truth": "2"}', json.dumps({"prompt": "9" * 40, "ground_truth": "1"})]
    )
    loaded = load_prompts([path], tok, 16)
    assert len(loaded.rows) == 1 and loaded.dropped_too_long == 1


def test_a_data_file_that_is_not_utf8(tmp_path, tok):
    path = tmp_path / "d.jsonl"
    path.write_bytes(b'{"prompt": "1+1=", "ground_truth": "2"}\n{"prompt": "caf\xe9", "ground_truth": "2"}\n')
    with pytest.raises(
        DataError,
        match=r"d.jsonl: row 1: not UTF-8 text \(invalid continuation byte at byte 55\); save the file as UTF-8$",
    ):
        load_prompts([str(path)], tok, 64)


def test_a_model_path_that_is_a_run_folder(tmp_path):
    (tmp_path / "config.yaml").write_text("run: {}\n")
    with pytest.raises(ConfigError, match=r"is an rlpost run folder, not a model: export its model first"):
        load_config(["+recipe=quickstart", f"model.path={tmp_path}"])


def test_a_stalled_actor_is_one_line_not_a_traceback(monkeypatch, capsys):
    import rlpost.controller.run as run
    from rlpost.cli import main
    from rlpost.controller.cluster import Stall

    def stalls(cfg):
        raise Stall("trainer rank 0: update has run 3600 s, past cluster.stall_timeout_s=3600")

    monkeypatch.setattr(run, "train", stalls)
    assert main(["train", "+recipe=quickstart"]) == 1
    assert (
        capsys.readouterr().err == "rlpost: trainer rank 0: update has run 3600 s, past cluster.stall_timeout_s=3600\n"
    )


def test_fewer_rows_than_a_batch():
    rows = [PromptRow([1], "1", "1", "arithmetic")] * 3
    with pytest.raises(DataError, match=r"^3 training rows are fewer than data.train_batch_size=4$"):
        PromptLoader(rows, 4, 0)


def test_a_data_source_no_reward_knows():
    with pytest.raises(DataError, match=r"reward.fn=auto has no reward function for data_source 'poetry'"):
        check_reward_routing([PromptRow([1], "x", "y", "poetry")], "auto")


# --------------------------------------------------------------------------- rewards at runtime
MISBEHAVE = """
import os, time

def f(sample):
    what = sample.response
    if what == "raise":
        raise ValueError("cannot parse")
    if what == "hang":
        time.sleep(3600)
    if what == "crash":
        os._exit(1)
    if what == "exit":
        raise SystemExit(3)
    if what == "text":
        return "yes"
    if what == "huge":
        return len(bytearray(10 * 2**30))
    return 1.0
"""


@pytest.fixture(scope="module")
def misbehaving_pool(tmp_path_factory):
    path = tmp_path_factory.mktemp("r") / "m.py"
    path.write_text(MISBEHAVE)
    pool = RewardPool(f"{path}:f", {}, 1, timeout_s=0.5, memory_mb=512, error_score=-1.0)
    yield pool
    pool.close()


@pytest.mark.parametrize(
    "response, kind, says",
    [
        ("raise", "errors", "ValueError: cannot parse"),
        ("hang", "timeouts", "timed out after reward.timeout_s=0.5"),
        ("crash", "crashes", "the reward worker died (exit code 1)"),
        ("text", "bad_values", "returned 'yes' (str), not a finite number"),
        ("huge", "errors", "MemoryError"),
        ("exit", "errors", "SystemExit: 3"),  # sys.exit() ends the call, not the worker
    ],
)
def test_a_reward_that_misbehaves_scores_error_score_and_is_counted(misbehaving_pool, response, kind, says):
    out = misbehaving_pool.score([RewardInput("1+1=", "ok", "2", "x"), RewardInput("1+1=", response, "2", "x")])
    assert out.scores == [1.0, -1.0] and out.counts["errors"] == 1 and out.error_rows == [1]
    assert (kind == "errors" or out.counts[kind] == 1) and out.counts["crashes"] == (kind == "crashes")
    assert out.first_error.startswith("sample 1: ") and says in out.first_error


def test_a_reward_that_hangs_on_every_sample_costs_three_timeouts_not_one_a_sample(misbehaving_pool):
    """Three timeouts in a row and the worker's other samples count as timeouts without running: 20
    hanging samples took 20 x reward.timeout_s (0.5 s here; 30 s by default: ten minutes a step)."""
    start = time.monotonic()
    out = misbehaving_pool.score([RewardInput("1+1=", "hang", "2", "x")] * 20)
    assert time.monotonic() - start < 5.0  # 3 x 0.5 s and the pool's round trip, not 10 s
    assert out.scores == [-1.0] * 20 and out.counts["timeouts"] == 20 and out.error_rows == list(range(20))
    assert misbehaving_pool.score([RewardInput("1+1=", "ok", "2", "x")]).scores == [1.0]  # the worker goes on


def test_a_batch_still_scoring_says_so_while_it_waits(tmp_path):
    path = tmp_path / "m.py"
    path.write_text(MISBEHAVE)
    pool = RewardPool(f"{path}:f", {}, 1, timeout_s=0.5, memory_mb=0, error_score=-1.0)
    said = []
    pool.pool.report_s, pool.pool.log = 0.6, said.append  # 50 s in a run
    try:
        out = pool.score([RewardInput("1+1=", "hang", "2", "x")] * 6)
    finally:
        pool.close()
    assert out.counts["timeouts"] == 6 and said
    assert re.fullmatch(  # (items left: those the worker has not finished, counted as it goes)
        r"reward: 1 of 1 workers still scoring their share \([4-6] of 6 items left\) after 1 s \(reward.timeout_s=0.5 "
        r"each; a function that hangs costs 3 of them a worker\)",
        said[0],
    )


def test_a_cluster_address_where_no_ray_answers_is_named_at_once():
    from rlpost.controller.cluster import check_cluster_answers
    from rlpost.weightsync.transport import free_port

    port = free_port()
    refused = rf"^cluster.address='127.0.0.1:{port}': no Ray cluster answers there \(Connection refused\); start one "
    with pytest.raises(ConfigError, match=refused + r"with `ray start --head` on that node, or fix the address$"):
        check_cluster_answers(f"127.0.0.1:{port}")
    with pytest.raises(ConfigError, match=r"^cluster.address='headnode': want host:port"):
        check_cluster_answers("headnode")
    for address in (":6379", "headnode:", "ray://headnode"):  # a host and a port, both
        with pytest.raises(ConfigError, match="want host:port"):
            check_cluster_answers(address)
    check_cluster_answers("auto")  # Ray's to find: nothing to try here
    with socket.create_server(("127.0.0.1", 0)) as server:  # something answers: as plain and as a client address
        check_cluster_answers(f"127.0.0.1:{server.getsockname()[1]}")
        check_cluster_answers(f"ray://127.0.0.1:{server.getsockname()[1]}")


# --------------------------------------------------------------------------------- checkpoints
def fake_checkpoint(run_dir, step, files):
    folder = run_dir / "checkpoints" / f"step_{step}"
    (folder / "trainer").mkdir(parents=True)
    for name, data in files.items():
        (folder / name).write_bytes(data)
    manifest = {name: len(data) for name, data in files.items()}
    (folder / checkpoint.MANIFEST).write_text(json.dumps(manifest))
    return folder


def test_resume_auto_passes_over_a_truncated_or_incomplete_newest_checkpoint(tmp_path):
    files = {"controller.pt": controller_bytes(), "trainer/0.distcp": b"w" * 100}
    old = fake_checkpoint(tmp_path, 2, files)
    cut = fake_checkpoint(tmp_path, 4, files)
    (cut / "trainer" / "0.distcp").write_bytes(b"w" * 50)
    gone = fake_checkpoint(tmp_path, 6, files)
    (gone / "trainer" / "0.distcp").unlink()
    said = []
    assert checkpoint.find(tmp_path, "auto", log=said.append) == old
    assert said == [
        f"checkpoint {gone} is damaged (trainer/0.distcp is missing); trying the one before it",
        f"checkpoint {cut} is damaged (trainer/0.distcp has 50 bytes, the manifest says 100); trying the one before it",
    ]
    with pytest.raises(FileNotFoundError, match=r"the checkpoint is damaged: trainer/0.distcp is missing"):
        checkpoint.find(tmp_path, str(gone))


def test_a_checkpoint_that_cannot_be_written_names_the_cause_and_the_one_to_resume_from(tmp_path, monkeypatch):
    fake_checkpoint(tmp_path, 2, {"controller.pt": controller_bytes()})

    def full_disk(*a, **k):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(checkpoint.torch, "save", full_disk)
    with pytest.raises(checkpoint.CheckpointError) as info:
        checkpoint.save(tmp_path, 4, {"step": 4}, [], keep=2)
    assert str(info.value) == (
        f"writing checkpoint {tmp_path / 'checkpoints' / 'step_4'} failed: OSError: [Errno 28] No space left on "
        f"device; the newest complete checkpoint is {tmp_path / 'checkpoints' / 'step_2'}; free space there, then "
        "run again with trainer.resume=auto"
    )
    assert sorted(p.name for p in (tmp_path / "checkpoints").iterdir()) == ["step_2"]


def test_a_checkpoint_missing_a_ranks_file_is_refused_by_name(tmp_path):
    from types import SimpleNamespace

    from rlpost.trainer.checkpoint import rank_files

    for r in (0, 2):
        torch.save({}, tmp_path / f"trainer_rank{r}.pt")
    engine = SimpleNamespace(name="trainer", rank=0, world_size=1)
    with pytest.raises(FileNotFoundError) as info:
        rank_files(engine, str(tmp_path))
    assert str(info.value) == f"checkpoint {tmp_path}: its trainer_rank<r>.pt files are of ranks [0, 2], not 0..N-1"


# ------------------------------------------------------------------------------------- signals
def test_a_first_signal_is_noted_and_a_second_stops_at_once():
    from rlpost.controller.signals import StopSignals

    before = signal.getsignal(signal.SIGINT), signal.getsignal(signal.SIGTERM)
    stop = StopSignals()
    stop.before_start = False  # the workers have started (before, a signal stops at once: test_run.py)
    try:
        os.kill(os.getpid(), signal.SIGTERM)
        assert stop.signal == signal.SIGTERM  # the step under way goes on
        with pytest.raises(KeyboardInterrupt, match="second SIGINT: stopping at once"):
            os.kill(os.getpid(), signal.SIGINT)
    finally:
        stop.restore()
    assert (signal.getsignal(signal.SIGINT), signal.getsignal(signal.SIGTERM)) == before  # put back


def test_an_episode_budget_that_cannot_hold_a_tool_call_is_said(tok):
    """The eighth catalogue's e21: the quickstart's 4-token budget with env.name=calculator trained
    as a single-turn run without a word (the model could never write a tool call)."""
    from rlpost.controller.setup import check_env, tool_budget_warning

    row = PromptRow(tok("1+2=")["input_ids"], "1+2=", "003", "arithmetic")
    shortest = len('<tool_call>{"name": "calculator", "arguments": {}}</tool_call>')  # a character a token
    for budget, said in [(4, True), (shortest - 1, True), (shortest, False)]:
        cfg = load_config(["+recipe=quickstart", "env.name=calculator", f"rollout.max_response_length={budget}"])
        warning = tool_budget_warning(cfg, check_env(cfg, row), tok)
        assert (warning is not None) == said, budget
    assert f"rollout.max_response_length={shortest - 1} tokens" in tool_budget_warning(
        load_config(["+recipe=quickstart", "env.name=calculator", f"rollout.max_response_length={shortest - 1}"]),
        check_env(cfg, row),
        tok,
    )
    with pytest.raises(ConfigError, match="env.tool_timeout_s=1e-06 must be >= 0.01"):
        load_config(["+recipe=quickstart", "env.name=calculator", "env.tool_timeout_s=0.000001"])
