"""The schema's sections around training: weight sync, reward, environment, logger, cluster, run."""

from __future__ import annotations

from dataclasses import dataclass

from rlpost.config.knobs import knob, section

# the longest timeout a key takes: far longer ones overflow the clocks of the signal timers, polls and
# stack dumps that enforce them (1e12 s: raw OverflowErrors, the nineteenth catalogue's t127, t129, t131)
WEEK_S = 7 * 24 * 3600


# ---------------------------------------------------------------------------- weight sync, reward
@dataclass
class WeightSyncConfig:
    bucket_mb: int = knob(
        256,
        "Size of the flat buffers weights travel in (the sender packs one while "
        "the previous one is on the wire and keeps two staging buffers of this "
        "size between syncs; a receiver holds about two while receiving).",
        ge=1,
    )
    verify: bool = knob(True, "Receivers check a checksum of every tensor they loaded.")
    timeout_s: int = knob(
        600,
        "Timeout of the weight-sync process group. An actor whose sync still runs "
        "after half of it prints the stack of each of its threads to stderr.",
        ge=1,
        le=WEEK_S,
    )


@dataclass
class RewardModelConfig:
    path: str = knob(
        "",
        "Reward model: a folder or hub id; `tiny` builds (once) a classifier of right vs wrong answers to the "
        "offline addition task from the tiny policy. Empty = no reward model (no `reward_model` role).",
    )
    kind: str = knob(
        "classifier",
        "`classifier`: a sequence-classification model, the score its logit (2 labels: label 1 minus label 0); "
        "`causal_lm`: a causal LM scored by `score_fn`.",
        ("classifier", "causal_lm"),
    )
    score_fn: str = knob(
        "", "`file.py:name` for `kind=causal_lm`: `name(model, tokenizer, prompts, responses)` -> one score each."
    )
    weight: float = knob(1.0, "Weight of the model's score in the training reward.")
    sigmoid: bool = knob(False, "Map a classifier's logit to (0, 1) with a sigmoid.")
    batch_size: int = knob(64, "Samples per reward-model forward pass.", ge=1)
    max_length: int = knob(2048, "Longest prompt + response (reward model tokens) scored; longer is truncated.", ge=1)


@dataclass
class RewardConfig:
    fn: str = knob("auto", "`auto` (by each row's data_source), a registered name, or `file.py:function`.")
    kwargs: dict = knob({}, "Keyword arguments for an explicitly named `fn` (e.g. gsm8k `method: flexible`).")
    rule_weight: float = knob(
        1.0, "Weight of the rule score (`fn`) in the training reward; validation scores by the rule alone."
    )
    num_workers: int = knob(2, "Processes that run a user `fn` in parallel (built-ins score in the controller).", ge=1)
    timeout_s: float = knob(30.0, "Time one sample's `fn` may take; past it the sample is a timeout.", gt=0, le=WEEK_S)
    memory_mb: int = knob(4096, "Address-space cap of each reward process, MiB (0 = none).", ge=0)
    error_score: float = knob(
        0.0, "Score of a sample whose `fn` raised, timed out, crashed or returned a non-finite or non-number."
    )
    max_error_fraction: float = knob(
        0.5, "Stop the run when more than this fraction of a training batch fails to score ...", ge=0, le=1
    )
    max_error_steps: int = knob(3, "... for this many consecutive batches (the first error and its traceback).", ge=1)
    model: RewardModelConfig = section(RewardModelConfig, "A reward model served by its own worker group.")


# ------------------------------------------------------------------------------------------- env
@dataclass
class EnvConfig:
    name: str = knob(
        "",
        "Multi-turn episodes with this environment: `calculator`, `python`, `retry`, or "
        "`file.py:factory` (docs/environments.md); empty: single-turn. Its tokens get no loss; "
        "`rollout.max_response_length` is the budget of the whole episode (the model's and the environment's tokens).",
    )
    max_turns: int = knob(4, "Most turns of the model in one episode.", ge=1)
    timeout_s: float = knob(
        300.0,
        "Wall-clock time of one episode; past it no further turn starts (counted). An environment its factory "
        "has not made within it ends its episode at once (counted in env/errors).",
        gt=0,
        le=WEEK_S,
    )
    tool_parser: str = knob(
        "hermes",
        "How tool calls are read from the model's text (`hermes`: `<tool_call>` JSON; an env file may register more).",
    )
    tool_timeout_s: float = knob(
        10.0,
        "Time one tool call may take; past it the model reads an error (a worker's round trip alone takes "
        "milliseconds: below 0.01 s every call would time out).",
        ge=0.01,
        le=WEEK_S,
    )
    workers: int = knob(
        16,
        "Environment steps (and factories) run at once in each rollout actor (threads), and worker processes for "
        "their tool calls.",
        ge=1,
    )
    tool_memory_mb: int = knob(4096, "Address-space cap of each tool worker process, MiB (0 = none).", ge=0)


# -------------------------------------------------------------------------------- logger, cluster
@dataclass
class LoggerConfig:
    backends: list = knob(
        ["console", "jsonl"],
        "Trackers: console, jsonl, tensorboard, wandb (`metrics.jsonl` is written whatever this says: the "
        "summary, `rlpost plot` and a resume read it).",
    )
    project: str = knob("rlpost", "Project name for wandb.")
    wandb_mode: str = knob("offline", "wandb mode; `offline` needs no network.", ("offline", "online", "disabled"))
    progress_bar: bool = knob(
        True,
        "Show a progress bar with step, reward, accuracy, step time and ETA (output to a file: a line a step instead).",
    )
    verbose: bool = knob(
        False,
        "Show the libraries' own output too (Ray's start-up notices, model-loading progress bars, "
        "vLLM's info lines); off: rlpost's lines and the warnings and errors of every process.",
    )
    plot: bool = knob(True, "At the end of a run, draw its curves into `curves.png` (needs matplotlib).")
    samples_per_step: int = knob(
        4,
        "Samples (prompt, response, reward) of each step written to `samples.jsonl` in the run folder (0 = none).",
        ge=0,
    )


@dataclass
class ClusterConfig:
    address: str = knob("", "Ray cluster address (`auto` or host:port); empty starts a local Ray.")
    placement: str = knob(
        "colocate",
        "`colocate`: rollout shares the trainer's devices and takes turns; `split`: disjoint devices.",
        ("colocate", "split"),
    )
    num_threads: int = knob(  # (100000: Ray did not start, then a crash: cat21's t132)
        1, "torch/OMP threads per actor (more threads on busy cores run slower).", ge=1, le=1024
    )
    stall_warn_s: float = knob(
        300.0, "Each time a call to the actors (generate, update, sync...) runs this long, say what still runs.", gt=0
    )
    stall_timeout_s: float = knob(
        3600.0,
        "Longest wait on one call to the actors, and the trainer ranks' collective timeout: past it the run "
        "stops, naming the role, rank and call it waited on. At least 60 s: the start's calls (the engines' "
        "load, the weight sync's set-up) take 10-30 s for the quickstart on a CPU, minutes for large models (10 "
        "was taken, then stopped the quickstart once its actors were up).",
        ge=60,
    )


@dataclass
class RunConfig:
    dir: str = knob("", "Run folder (config, metrics, checkpoints); empty: runs/<date>_<time>.")
    seed: int = knob(0, "Seed of data order, sampling and initialisation.", ge=0, le=2**31 - 1)
    overwrite: bool = knob(
        False, "Start anew in a run.dir that holds another run's steps, deleting its logs and checkpoints."
    )
