"""What a run needs before any actor starts: its prompts checked and loaded (a resumed checkpoint's place in them
too), the model's positions against the lengths asked for, its weights against its config.json, its tokenizer's
eos token, and a user's reward function tried once (its folder: `controller/run_dir.py`)."""

from __future__ import annotations

import functools
import json
from pathlib import Path

from rlpost.config import ConfigError, TrainConfig
from rlpost.controller.alerts import setting_warnings, tiny_chat_warning, tiny_keys_warning, worker_count_warning
from rlpost.controller.checkpoint import check_data_place
from rlpost.controller.plan import lora_rank_refusal
from rlpost.controller.reward_checks import check_reward_values
from rlpost.controller.scoring import not_loaded
from rlpost.data.dataset import DataError, PromptLoader, PromptRow, load_prompts
from rlpost.data.row_warnings import (
    conflict_warning,
    copy_warning,
    overlap_warning,
    short_cap_warning,
    unknown_token_warning,
)
from rlpost.data.tasks import cached_task, task_cache_name, task_rows
from rlpost.envs import EpisodeRow, make_env
from rlpost.envs.base import env_factory
from rlpost.models.checks import architecture_problem, cut_short, meta_model, weight_mismatch
from rlpost.models.loading import resolve_path
from rlpost.rewards import REWARDS
from rlpost.rewards.base import is_trusted
from rlpost.rewards.pool import RewardPool


def data_sources(cfg: TrainConfig) -> tuple[list[str], list[str]]:
    """Train and validation sources; an offline task writes its rows as jsonl first, into a folder
    named by every setting that changes them (`rlpost.data.tasks.TASKS`)."""
    if cfg.data.task:
        folder = Path(cfg.model.cache_dir).expanduser() / "data" / task_cache_name(cfg.data)
        cached_task(folder, lambda: task_rows(cfg.data))
        return [str(folder / "train.jsonl")], [str(folder / "val.jsonl")]
    for key in ("train_files", "val_files"):
        check_commas(list(getattr(cfg.data, key)), f"data.{key}")
    return list(cfg.data.train_files), list(cfg.data.val_files)


def check_commas(files: list[str], key: str) -> None:
    """A file name with a comma, given unquoted in a list, is cut there into two items (the seventeenth
    catalogue's t29: "no such file" for its first half): named, with the quoting that keeps it whole."""
    for i, first in enumerate(files):
        for j in range(i + 1, len(files)):
            name = ",".join(files[i : j + 1])
            if not Path(first).expanduser().exists() and Path(name).expanduser().exists():
                raise ConfigError(
                    f"{key}: {', '.join(map(repr, files[i : j + 1]))} are one file, {name}, cut at its comma: "
                    f"quote its name: \"{key}=['{name}']\""
                )


def check_reward_routing(rows: list[PromptRow], reward_fn: str, default: str = "") -> None:
    """With `reward.fn=auto`, every row's data_source (`default`: the one rows without were given)
    must name a registered reward function: fail at start rather than score every sample 0."""
    unknown = sorted({r.data_source for r in rows} - set(REWARDS)) if reward_fn == "auto" else []
    if default and default in unknown:  # (cat20's t153: read as a row's, and the key that set it suggested)
        raise DataError(
            f"data.default_data_source={default!r}, given to the rows without a data_source, names no registered "
            f"reward function (reward.fn=auto routes by it): choose one of {sorted(REWARDS)}, or set reward.fn"
        )
    if unknown:
        what = "rows without a data_source" if unknown[0] == "" else f"data_source {unknown[0]!r}"
        raise DataError(
            f"reward.fn=auto has no reward function for {what}; set reward.fn=NAME or "
            f"path/to/file.py:function, or data.default_data_source=NAME "
            f"(registered: {sorted(REWARDS)})"
        )


def env_tools(cfg: TrainConfig):
    """Multi-turn runs: `row -> the tool schemas of the environment its episodes run in`, which a
    chat-message prompt advertises through the chat template's `tools` (the environment made to
    read them sees the row's prompt as given: a string, or the messages as JSON)."""
    if not cfg.env.name:
        return None

    def tools_of(row: dict) -> list[dict]:
        prompt = row["prompt"] if isinstance(row["prompt"], str) else json.dumps(row["prompt"])
        source = row["data_source"] or cfg.data.default_data_source
        env = make_env(cfg.env.name, EpisodeRow(prompt, row["ground_truth"], source), cfg.env)
        for i, t in enumerate(env.tools):
            if not hasattr(t, "schema"):  # (a plain function: an AttributeError traceback, cat10's t36)
                raise ConfigError(
                    f"env.name={cfg.env.name}: its tools[{i}] ({getattr(t, '__name__', repr(t))}) is a "
                    f"{type(t).__name__} without a schema, not a tool; decorate the function with @rlpost.envs.tool"
                )
        return [t.schema for t in env.tools]

    return tools_of


def load_data(
    cfg: TrainConfig, tokenizer, log=print, model_path: str | None = None, pool: RewardPool | None = None
) -> tuple[PromptLoader, list[PromptRow], int]:
    """(the training prompts' loader, the validation rows, how many prompts were too long), after
    `check_positions` of `model_path`; a user's reward function is tried on the first row (in
    `pool`, the run's reward pool, where given)."""
    if model_path is not None:
        check_positions(cfg, model_path)
        check_lora_targets(cfg, model_path)
        check_weights(cfg, model_path)
        check_eos(cfg, tokenizer, model_path)
    train_src, val_src = data_sources(cfg)
    d, tools_of = cfg.data, env_tools(cfg)
    scorer = functools.partial(own_scorer, cfg.reward.fn)
    train = load_prompts(train_src, tokenizer, d.max_prompt_length, d.default_data_source, tools_of, scorer)
    val = load_prompts(val_src, tokenizer, d.max_prompt_length, d.default_data_source, tools_of, scorer)
    if d.default_data_source and not train.defaulted + val.defaulted:  # (read by no row: the twelfth catalogue's t169)
        raise ConfigError(
            f"data.default_data_source={d.default_data_source!r} is read only for rows without a data_source, and "
            f"every row of {', '.join(train_src + val_src)} has its own: leave it out"
        )
    dropped = train.dropped_too_long + val.dropped_too_long
    if dropped:
        log(f"dropped {dropped} prompts longer than data.max_prompt_length={cfg.data.max_prompt_length} tokens")
    check_row_counts(cfg, train_src, len(train.rows), val_src, len(val.rows), train.dropped_too_long)
    check_vocab(cfg, tokenizer, model_path, train.rows + val.rows)
    check_reward_routing(train.rows + val.rows, cfg.reward.fn, d.default_data_source)
    env = check_env(cfg, train.rows[0])
    check_reward_values(cfg, train.rows, log, pool)
    warnings = [overlap_warning(train.rows, val.rows), conflict_warning(train.rows)]
    warnings.append(copy_warning(train.rows, train.files))
    warnings.append(tiny_chat_warning(cfg, train.chat + val.chat))
    warnings.append(unknown_token_warning(train.rows + val.rows, tokenizer))
    warnings.append(short_cap_warning(train.rows, tokenizer, cfg.rollout.max_response_length))
    warnings += [tool_budget_warning(cfg, env, tokenizer), tiny_keys_warning(cfg), worker_count_warning(cfg)]
    for warning in [*setting_warnings(cfg), *warnings]:
        if warning:
            log(warning)
    log(f"data: {len(train.rows)} training prompts, {len(val.rows)} validation prompts")
    loader = PromptLoader(train.rows, cfg.data.train_batch_size, cfg.run.seed, cfg.data.shuffle)
    check_data_place(cfg, loader)  # before any actor starts: the eleventh catalogue's t84
    return loader, val.rows, dropped


def model_and_base(cfg: TrainConfig, run_dir: Path, log=print) -> tuple[str, str | None]:
    """The policy's local path, and with LoRA the fingerprint of its base weights, checked against
    the checkpoint this run resumes (`checkpoint.check_base`) before any actor starts."""
    from rlpost.controller import checkpoint
    from rlpost.models.fingerprint import weights_fingerprint
    from rlpost.tiny.build import resolve_model_path

    path = resolve_model_path(cfg.model, cfg.data, cfg.trainer.device, log=log)
    base = weights_fingerprint(path) if cfg.model.lora.rank > 0 else None
    if cfg.trainer.resume != "none":
        checkpoint.check_base(checkpoint.find(run_dir, cfg.trainer.resume, log=lambda *_: None), base, path)
    return path, base


def own_scorer(reward_fn: str, data_source: str) -> str | None:
    """The name of rlpost's own scorer of a row (each compares answers with its ground truth), or
    None where the user's function scores it."""
    if not is_trusted(reward_fn, data_source):
        return None
    return data_source if reward_fn == "auto" else reward_fn


def check_row_counts(
    cfg: TrainConfig, train_src: list[str], n_train: int, val_src: list[str], n_val: int, train_dropped: int = 0
) -> None:
    """Enough prompts for a batch, and validation prompts where validation or the start's pass@k
    will run: refused before any actor starts, naming the files (or the empty list); files with no
    rows at all are said to be empty."""
    d, t = cfg.data, cfg.trainer
    train_what = f"data.task={d.task!r}" if d.task else f"data.train_files={train_src}"
    val_what = f"data.task={d.task!r}" if d.task else f"data.val_files={val_src}"
    if n_train == 0 and not train_dropped:
        raise DataError(f"{train_what} holds no rows (empty): give the training prompts in it, a row a prompt")
    if n_train < d.train_batch_size:
        raise DataError(
            f"{train_what} gave {n_train} training prompts (after data.max_prompt_length="
            f"{d.max_prompt_length}), fewer than data.train_batch_size={d.train_batch_size}: give more rows or a "
            "smaller batch"
        )
    needs = [f"trainer.{k}={v}" for k, v in (("val_every", t.val_every), ("start_pass_k", t.start_pass_k)) if v]
    if n_val == 0 and needs:
        raise DataError(
            f"{val_what} gave no validation prompts, which {' and '.join(needs)} need: give data.val_files=[FILE] "
            f"(held-out rows in the training rows' format), or set {' '.join(n.split('=')[0] + '=0' for n in needs)} "
            "to train without them"
        )


def check_env(cfg: TrainConfig, row: PromptRow):
    """Multi-turn runs: the environment is made for the first training row before any actor starts;
    a factory that raises, or returns no environment (no `step`), stops the run here naming
    `env.name`, not in a rollout worker's traceback."""
    if not cfg.env.name:
        return None
    factory = env_factory(cfg.env.name)  # an unknown name or a file that will not load: named by env_factory
    try:
        env = factory(EpisodeRow(row.prompt_text, row.ground_truth, row.data_source), cfg.env)
    except Exception as e:  # noqa: BLE001  (the user's factory, run: whatever it raises is named)
        raise ConfigError(
            f"env.name={cfg.env.name!r}: making the environment of the first training row raised "
            f"{type(e).__name__}: {e}"
        ) from e
    if isinstance(env, type):  # its `step` is a function of the class: every episode failed (cat10's t35)
        raise ConfigError(
            f"env.name={cfg.env.name!r}: the factory returned the class {env.__name__}, not an environment made "
            f"from it: return {env.__name__}(...)"
        )
    if not callable(getattr(env, "step", None)):
        raise ConfigError(
            f"env.name={cfg.env.name!r}: the factory returned {type(env).__name__}, not an environment (an object "
            "with a step(turn) method and a tools list: docs/environments.md)"
        )
    if ".py:" in cfg.env.name:  # the user's `step`, tried once (the seventeenth catalogue's t121, t123)
        check_first_step(cfg, env, row)  # (what the start reads of `env` after it is its tools)
    return env


def check_first_step(cfg: TrainConfig, env, row: PromptRow) -> None:
    """A user's environment answers a stand-in first turn (the row's ground truth as the model's text;
    the environment is the start's own, never an episode's): an answer that is no EnvStep ends every
    episode, so it stops the run here; one that raises may depend on the text, and is left to the
    episodes to count."""
    from rlpost.envs.base import Turn
    from rlpost.rollout.episodes import step_problem

    try:
        answer = env.step(Turn(row.ground_truth, (), 0))
    except Exception:  # noqa: BLE001  (the user's step on a made-up turn: counted in the episodes if it recurs)
        return
    if problem := step_problem(answer):
        raise ConfigError(
            f"env.name={cfg.env.name!r}: its step, tried on a first turn whose text is the first training row's "
            f"ground truth ({row.ground_truth!r}), {problem}: every episode would end there; return an EnvStep "
            "(from rlpost.envs import EnvStep: docs/environments.md)"
        )


def tool_budget_warning(cfg: TrainConfig, env, tokenizer) -> str | None:
    """An environment of tools whose episode budget (`rollout.max_response_length`) cannot hold the
    shortest call of any of them (`hermes`: the call with no arguments): the model can never call
    a tool, and the run trains as a single-turn one (the eighth catalogue's e21)."""
    tools = getattr(env, "tools", None)
    if not tools or cfg.env.tool_parser != "hermes":
        return None
    schemas = [getattr(t, "schema", None) for t in tools]  # (what the chat template advertises)
    names = [s.get("function", s).get("name") for s in schemas if isinstance(s, dict)]
    names = [n for n in names if isinstance(n, str)]
    if not names:
        return None
    calls = [f'<tool_call>{{"name": "{name}", "arguments": {{}}}}</tool_call>' for name in names]
    need = min(len(tokenizer(c, add_special_tokens=False)["input_ids"]) for c in calls)
    if need <= cfg.rollout.max_response_length:
        return None
    return (
        f"warning: rollout.max_response_length={cfg.rollout.max_response_length} tokens, the budget of a whole "
        f"episode, cannot hold one call of a tool of env.name={cfg.env.name!r} (the shortest, with no arguments, "
        f"is {need} tokens): the model can never call a tool; raise it (+recipe=multiturn_tools uses 160)"
    )


def check_positions(cfg: TrainConfig, model_path: str) -> None:
    """A prompt and its response must fit the model's positions (`max_position_embeddings` of a
    local model's config.json): refuse lengths that do not, naming both keys."""
    config = Path(model_path) / "config.json"
    if not config.is_file():
        return  # a hub id: transformers checks it when it loads
    positions = json.loads(config.read_text()).get("max_position_embeddings")
    p, r = cfg.data.max_prompt_length, cfg.rollout.max_response_length
    if isinstance(positions, int) and p + r > positions:
        raise ConfigError(
            f"data.max_prompt_length={p} + rollout.max_response_length={r} = {p + r} tokens, more than the "
            f"{positions} positions of the model ({model_path}, max_position_embeddings): lower one of them"
        )


def check_lora_targets(cfg: TrainConfig, model_path: str) -> None:
    """Every name in `model.lora.target_modules` must be a layer of the model (peft matches a
    module's name or its last parts): refused before any actor starts, listing the names there are
    (the model built on the meta device from a local config.json: no weights are read)."""
    import torch

    targets, trust, rank = list(cfg.model.lora.target_modules), cfg.model.trust_remote_code, cfg.model.lora.rank
    if rank <= 0 or not (Path(model_path) / "config.json").is_file():
        return
    model = meta_model(model_path, trust)
    if problem := lora_rank_refusal(rank, model_path, getattr(model.config, "hidden_size", None)):
        raise ConfigError(problem)
    if targets == ["all-linear"]:
        return
    layers = [n for n, m in model.named_modules() if isinstance(m, (torch.nn.Linear, torch.nn.Embedding))]
    missing = [t for t in targets if not any(n == t or n.endswith(f".{t}") for n in layers)]
    if missing:
        raise ConfigError(
            f"model.lora.target_modules={targets}: {missing} names no layer of {model_path}; its layers are "
            f"{sorted({n.rsplit('.', 1)[-1] for n in layers})} (or [all-linear])"
        )
    embedding = model.get_input_embeddings().weight  # (the trainer refuses these too, but after Ray started)
    shared = [n for n, m in model.named_modules() if getattr(m, "weight", None) is embedding]
    tied = [t for t in targets if any(n == t or n.endswith(f".{t}") for n in shared)]
    if tied:
        raise ConfigError(
            f"model.lora.target_modules={targets}: LoRA on {tied}, whose weight is the input embeddings' (tied in "
            f"{model_path}), is not supported; leave it out of model.lora.target_modules"
        )


def check_weights(cfg: TrainConfig, model_path: str) -> None:
    """A local model's weights must have the shapes its config.json asks for (the safetensors
    headers against the meta-device model): refused before any actor starts, naming the first
    tensor that does not fit, not in the actors' loading report."""
    short = cut_short(model_path)
    if short:
        again = " (model.path=tiny: delete that folder and it is built again)" if cfg.model.path == "tiny" else ""
        raise ConfigError(f"model.path={cfg.model.path!r}: {short}; fetch or copy it again{again}")
    if problem := architecture_problem(model_path, cfg.model.trust_remote_code):
        raise ConfigError(f"model.path={cfg.model.path!r}: {problem}")
    problem = weight_mismatch(model_path, cfg.model.trust_remote_code)
    if problem:
        raise ConfigError(
            f"model.path={cfg.model.path!r}: the weights in {model_path} do not fit its config.json: {problem}"
        )


def check_vocab(cfg: TrainConfig, tokenizer, model_path: str | None, rows: list[PromptRow]) -> None:
    """Every token id the model will be fed (the prompts', eos, pad) must be one of its embedding's
    rows (config.json's `vocab_size`): a tokenizer of another, larger vocabulary is refused here,
    not as an index error in the first generation."""
    config = Path(model_path or "") / "config.json"
    if not config.is_file():
        return
    vocab = json.loads(config.read_text()).get("vocab_size")
    ids = [max(row.prompt_ids, default=0) for row in rows] + [tokenizer.eos_token_id or 0, tokenizer.pad_token_id or 0]
    if isinstance(vocab, int) and max(ids) >= vocab:
        raise ConfigError(
            f"model.path={cfg.model.path!r}: the tokenizer in {model_path} gives token id {max(ids)}, but the model "
            f"has {vocab} (vocab_size in config.json): the tokenizer is another model's; give the model's own"
        )
    critic = Path(cfg.critic.model_path).expanduser() / "config.json" if cfg.critic.model_path else None
    theirs = json.loads(critic.read_text()).get("vocab_size") if critic and critic.is_file() else None
    if isinstance(vocab, int) and isinstance(theirs, int) and theirs < vocab:  # (the ninth catalogue's n30)
        raise ConfigError(
            f"critic.model_path={cfg.critic.model_path!r} has {theirs} tokens (vocab_size), the policy {vocab}: the "
            "critic reads the policy's tokens, any of which a response may hold; give one of the policy's vocabulary"
        )


def check_eos(cfg: TrainConfig, tokenizer, model_path: str) -> None:
    """The tokenizer must have an eos token, which ends every response and marks where one ended:
    refused before any actor starts, not at the first step's response masks."""
    if tokenizer.eos_token_id is None:
        raise ConfigError(
            f"model.path={cfg.model.path!r}: the tokenizer in {model_path} has no eos_token (the token that ends a "
            f"response): set eos_token in {Path(model_path) / 'tokenizer_config.json'} to the model's end token "
            "(one of its vocabulary, e.g. <|endoftext|>), and eos_token_id in config.json and generation_config.json"
        )


def reward_pool(cfg: TrainConfig) -> RewardPool:
    """The run's reward pool. A user's reward file (`path.py:name`) runs in its first worker now,
    so what the file raises as it runs stops the run before a model is built or loaded; the
    worker keeps the function for the run (the file runs once a worker, and never in this process)."""
    r = cfg.reward
    pool = RewardPool(r.fn, r.kwargs, r.num_workers, r.timeout_s, r.memory_mb, r.error_score)
    try:
        pool.load()
    except RuntimeError as e:
        pool.close()
        raise not_loaded(r.fn, e, r.memory_mb) from None
    except BaseException:  # a stop signal while the file runs: its worker ends now (the fifteenth's t29: 81 s)
        pool.close()
        raise
    return pool


def resolve_critic_path(cfg: TrainConfig, policy_path: str) -> str:
    """The value model's starting weights: `critic.model_path` (a folder or hub id), or the
    policy's (`policy_path`, `model.path` resolved) when it is empty."""
    if not cfg.critic.model_path:
        return policy_path
    return resolve_path(cfg.critic.model_path, cfg.model.cache_dir)


def resolve_reward_model_path(cfg: TrainConfig, policy_path: str, log=print) -> str:
    """`reward.model.path` as a folder or hub id; `tiny` builds (once) the tiny reward model from
    the tiny policy (`policy_path` when `model.path=tiny`, else the tiny policy is built too)."""
    path = cfg.reward.model.path
    if path == "tiny":
        import torch

        from rlpost.tiny.build import ensure_tiny_model
        from rlpost.tiny.reward import ensure_tiny_reward_model

        device = "cuda" if cfg.trainer.device == "cuda" and torch.cuda.is_available() else "cpu"
        policy = policy_path if cfg.model.path == "tiny" else str(ensure_tiny_model(cfg.model, cfg.data, device, log))
        data = cfg.data
        return str(ensure_tiny_reward_model(policy, data.arithmetic_digits, data.val_size, device, log))
    return resolve_path(path, cfg.model.cache_dir, log)
