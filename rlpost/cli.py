"""`rlpost train | data | export | plan | plot | doctor`.

rlpost train +recipe=quickstart trainer.total_steps=20     # Hydra overrides after the verb
rlpost train --help | --cfg job | -m run.seed=0,1,2 ...     # usage; the composed config; a sweep
rlpost data arithmetic --out data/arithmetic                # write an offline task as jsonl
rlpost export RUN_DIR [--step N] --out DIR                  # checkpoint -> Hugging Face folder
rlpost plan +recipe=grpo_lora [--gpu-gb 80]                # memory per GPU, before renting it
rlpost plot RUN_DIR [RUN_DIR ...] | FILE.json [--out PNG]   # curves of runs, or of a benchmark
rlpost doctor [--config-docs]                               # check the install / print key docs
rlpost --version                                            # rlpost's version (and commit, in a checkout)
"""

from __future__ import annotations

import argparse
import contextlib
import errno
import os
import signal
import sys
from pathlib import Path

from rlpost.console import Terminated, raise_terminated


def cmd_train(argv: list[str]) -> int:
    """`rlpost train [OVERRIDE ...] [--cfg job] [-m] [-h]` (rlpost/config/command_line.py)."""
    from rlpost.limits import LimitError, check_limits

    try:  # before torch loads (rlpost.config imports it): a low `ulimit -v` failed in its import (cat21's t41)
        check_limits()
    except LimitError as e:
        return print(f"rlpost: {e}", file=sys.stderr) or 2
    from rlpost.config import ConfigError
    from rlpost.config.command_line import parse_train_args, repeated_keys, train_help
    from rlpost.config.compose import RECIPE_DIR

    try:
        args = parse_train_args(argv)
    except ConfigError as e:
        print(f"rlpost: {e}", file=sys.stderr)
        return 2
    if args.help:
        print(train_help(sorted(p.stem for p in RECIPE_DIR.glob("*.yaml"))))
        return 0
    repeated = repeated_keys(args.overrides)  # said once the config holds (else it says the last is refused)
    if args.multirun:
        if repeated:
            print("".join(f"rlpost: {said}\n" for said in repeated), end="", file=sys.stderr)
        from rlpost.sweep import train_sweep

        return train_sweep(args.overrides, args.show_config)
    return train_once(args.overrides, args.show_config, repeated)


def checked_config(overrides: list[str]):
    """The validated config with its reward function found, or None after saying what is wrong."""
    from rlpost.config import ConfigError, load_config
    from rlpost.rewards.base import check_reward_fn

    try:
        cfg = load_config(overrides)
        check_reward_fn(cfg.reward.fn, cfg.reward.model.score_fn)  # a bad one fails here, before anything starts
    except (ConfigError, FileNotFoundError, KeyError, AttributeError, ValueError) as e:
        hint = " (or sweep over the values with -m/--multirun)" if "Ambiguous value" in str(e) else ""
        if "is not a ListConfig" in str(e):
            hint = " (a list is written in brackets: KEY=[a,b])"
        if "Cannot assign str to Dict" in str(e):
            hint = " (a mapping is written in braces, its new keys with +: +KEY={name: value})"
        if "extraneous input '='" in str(e):  # Hydra's grammar: the parser's token list is no help here
            e, hint = str(e).split(": extraneous")[0], ": write KEY=VALUE, with one ="
        if "Value '' of type 'str' could not be converted" in str(e):  # `key=` with nothing after it
            hint = " (the override gives the key no value: write KEY=VALUE, or KEY=null where null is allowed)"
        if "LexerNoViableAlt" in str(e) and "quote a value" not in str(e):  # (said once: the fifteenth's t08)
            hint = """ (quote a value that holds characters such as ~ = , [ ] or spaces: "run.dir='~/runs/a'")"""
        if not any(o.startswith("+recipe=") for o in overrides):  # (the defaults alone: the twelfth catalogue's t88)
            hint += "; no recipe was given: start from one, e.g. +recipe=quickstart (rlpost train --help lists them)"
        print(f"rlpost: config error: {e}{hint}", file=sys.stderr)
        return None
    return cfg


def train_once(overrides: list[str], show_config: bool = False, repeated: list[str] = ()) -> int:
    cfg = checked_config(overrides)
    if cfg is None:  # (a repeated key's last value refused: not "it is used", the eleventh catalogue's t39)
        return 2
    if repeated:  # (an empty write to a full stderr failed: the review of cat20's t122)
        print("".join(f"rlpost: {said}\n" for said in repeated), end="", file=sys.stderr)
    if show_config:
        from rlpost.config import to_yaml

        print(to_yaml(cfg), end="")
        return 0
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    import torch

    torch.set_num_threads(cfg.cluster.num_threads)
    from rlpost.config import ConfigError
    from rlpost.controller.checkpoint import CheckpointError
    from rlpost.controller.cluster import RayDidNotStart, Stall
    from rlpost.controller.run import WorkersDied, train
    from rlpost.controller.scoring import RewardFailure
    from rlpost.controller.signals import Stopped
    from rlpost.data.dataset import DataError
    from rlpost.metrics.trackers import TrackerError
    from rlpost.models.gguf import GGUFError
    from rlpost.models.loading import ModelFileError

    try:
        train(cfg)
    except (DataError, FileNotFoundError, ConfigError, GGUFError, ModelFileError) as e:
        # bad input (names the file, row and field) or settings that do not fit the machine
        print(f"rlpost: {e}", file=sys.stderr)
        return 2
    except Stopped as e:  # SIGTERM / SIGINT: the controller said where it stopped
        from rlpost.controller.cluster import local_ray_died

        if local_ray_died():  # the signal took Ray's processes too: its exit hooks would wait a minute
            sys.stdout.flush()
            sys.stderr.flush()
            os._exit(e.exit_code)
        return e.exit_code
    except (CheckpointError, Stall, TrackerError, WorkersDied, RayDidNotStart) as e:  # a full disk; a call that
        # never returned; W&B; actors or a node that died with no restart left; a local Ray that did not come up
        print(f"rlpost: {e}", file=sys.stderr)
        return 1
    except RewardFailure as e:  # the reward function fails on most samples, step after step
        print(f"rlpost: reward function failing: {e}", file=sys.stderr)
        return 1
    except KeyboardInterrupt as e:  # a second signal, or one during start-up: no checkpoint
        print(f"rlpost: interrupted ({e or 'SIGINT'}); the actors are shut down", file=sys.stderr)
        return 128 + getattr(e, "signum", 2)  # (SIGINT: 130)
    return 0


def cmd_data(argv: list[str]) -> int:
    """`rlpost data TASK --out DIR [data.KEY=VALUE ...]`: an offline task's rows, as a run makes them."""
    from rlpost.data.tasks import TASKS

    parser = argparse.ArgumentParser(
        prog="rlpost data",
        description="Write an offline task's rows as DIR/train.jsonl and DIR/val.jsonl. Settings are the "
        "`data` section's keys, as `data.KEY=VALUE` after the options (e.g. data.operands=4).",
        epilog="tasks: " + "; ".join(f"{name}: {task.help}" for name, task in TASKS.items()),
    )
    parser.add_argument("task", choices=list(TASKS))
    parser.add_argument("--out", required=True)
    parser.add_argument("--digits", type=int, default=None, help="data.arithmetic_digits")
    parser.add_argument("--num-val", type=int, default=None, help="data.val_size")
    args, overrides = parser.parse_known_args(argv)
    from rlpost.config import ConfigError, compose
    from rlpost.config.rules import check_values
    from rlpost.data.tasks import task_rows, write_jsonl

    flags = {"arithmetic_digits": args.digits, "val_size": args.num_val}
    given = {o.lstrip("+").partition("=")[0]: o for o in overrides}
    overrides = [f"data.task={args.task}", *overrides] + [f"data.{k}={v}" for k, v in flags.items() if v is not None]
    try:
        both = [(k, v) for k, v in flags.items() if v is not None and f"data.{k}" in given]
        if both:  # (the option's value was taken and the key dropped without a word)
            key, value = both[0]
            raise ConfigError(f"data.{key} given twice, as {given[f'data.{key}']} and by its option ({value}): one")
        if any(not o.lstrip("+").startswith("data.") for o in overrides):
            raise ConfigError(f"rlpost data takes data.KEY=VALUE settings only, got {overrides[1:]}")
        reads = TASKS.get(args.task).reads  # (not a run's batch, length or order: the fourteenth catalogue's t20)
        unread = [o for o in overrides[1:] if o.lstrip("+").split("=")[0].split(".")[1] not in reads]
        if unread:
            listed = ", ".join(f"data.{k}" for k in reads)
            raise ConfigError(f"{', '.join(unread)}: {args.task}'s rows do not read it (they read {listed})")
        cfg = compose(overrides)
        check_values(cfg, "data.")
        out = Path(args.out)  # a file as --out, or files of the user's in it: not replaced
        there = [p for p in (out, out / "train.jsonl", out / "val.jsonl") if p.is_file()]
        if there:
            raise ConfigError(
                f"{there[0]} exists (an earlier rlpost data's, or yours); rlpost data writes train.jsonl and val.jsonl "
                "into the folder --out and replaces no file: choose another --out, or move those files away"
            )
        train, val = task_rows(cfg.data)
    except (ConfigError, ValueError) as e:  # a bad key or value; DataError: the task cannot make these rows
        print(f"rlpost data: {e}", file=sys.stderr)
        return 2
    out, previous = Path(args.out), signal.signal(signal.SIGTERM, raise_terminated)
    try:
        print(write_jsonl(train, out / "train.jsonl"), len(train), "rows")
        print(write_jsonl(val, out / "val.jsonl"), len(val), "rows")
    except Terminated:  # (the file being written goes with it: the eighteenth catalogue's t83)
        print("rlpost data: stopped by SIGTERM; the files listed above are whole, no other was left", file=sys.stderr)
        return 143
    except OSError as e:  # a file on the way to --out, no permission, a full disk
        print(f"rlpost data: --out {out}: cannot write there ({e.strerror}); choose another --out", file=sys.stderr)
        return 2
    finally:
        signal.signal(signal.SIGTERM, previous)
    return 0


def cmd_export(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(
        prog="rlpost export",
        description="Write a run's checkpoint as a Hugging Face model folder "
        "(with LoRA: the adapter merged into the base model).",
    )
    parser.add_argument("run_dir", help="the run folder (run.dir), with config.yaml and checkpoints/")
    parser.add_argument("--step", type=int, default=None, help="checkpoint step (default: the newest complete one)")
    parser.add_argument("--out", required=True, help="folder to write (new or empty)")
    parser.add_argument(
        "--dtype",
        choices=["float32", "bfloat16", "float16"],
        default=None,
        help="dtype of the saved weights (default: the run's model.dtype)",
    )
    args = parser.parse_args(argv)
    if sum(a == "--step" or a.startswith("--step=") for a in argv) > 1:
        parser.error("--step given more than once: give the one checkpoint step to export")
    from safetensors import SafetensorError

    from rlpost.config import ConfigError
    from rlpost.controller.export import export

    previous = signal.signal(signal.SIGTERM, raise_terminated)  # (a SIGTERM left a half-written --out: cat12's t99)
    try:
        export(args.run_dir, args.out, args.step, args.dtype)
    except Terminated:
        print(f"rlpost export: stopped by SIGTERM; {args.out} is left as it was before the export", file=sys.stderr)
        return 143
    except (FileNotFoundError, FileExistsError, ConfigError, ValueError) as e:
        print(f"rlpost export: {e}", file=sys.stderr)
        return 2
    except (OSError, SafetensorError) as e:  # a full disk, no permission: the half-made folder is gone
        why = getattr(e, "strerror", None) or str(e).strip().splitlines()[-1][:200]
        print(f"rlpost export: cannot write {args.out} ({why}): free space, or give another --out", file=sys.stderr)
        return 1
    finally:
        signal.signal(signal.SIGTERM, previous)
    return 0


def cmd_plan(argv: list[str]) -> int:
    """`rlpost plan [--gpu-gb N] OVERRIDES...`: the memory plan of a training config, per GPU."""
    gpu_gb = None
    if argv[:1] in (["-h"], ["--help"]):  # as every other command (the eleventh catalogue's t62)
        print(cmd_plan.__doc__ + "\n\n--gpu-gb N: the GPU's memory in GiB (default: this machine's GPU, else 80)")
        return 0
    argv = [w for a in argv for w in (a.split("=", 1) if a.startswith("--gpu-gb=") else [a])]  # --gpu-gb=N too
    if "--gpu-gb" in argv:
        i = argv.index("--gpu-gb")
        try:
            gpu_gb = float(argv[i + 1])
        except (IndexError, ValueError):
            gpu_gb = -1.0
        if not 0 < gpu_gb < float("inf"):  # (1e400 was taken: "inf GiB", the eleventh catalogue's t64)
            print("rlpost plan: --gpu-gb takes the GPU memory in GiB, above 0 (80 for an H100)", file=sys.stderr)
            return 2
        argv = argv[:i] + argv[i + 2 :]
    options = [a for a in argv if a.startswith("-")]
    if options:
        what = "--gpu-gb given twice" if options[0].startswith("--gpu-gb") else f"unknown option {options[0]}"
        print(f"rlpost plan: {what} (the one option is --gpu-gb N, given once)", file=sys.stderr)
        return 2
    from rlpost.config import ConfigError, load_config
    from rlpost.controller.plan import (
        GIB,
        check_plan,
        format_plan,
        gpu_plan,
        gpu_size,
        largest_token_budget,
        lora_rank_refusal,
        micro_batch_tokens,
        plan_header,
        shape_of,
    )
    from rlpost.models.loading import resolve_path

    try:
        cfg = load_config(argv, this_machine=False)
        path = cfg.model.path if cfg.model.path == "tiny" else resolve_path(cfg.model.path, cfg.model.cache_dir)
        shape = shape_of(cfg, path)  # a GGUF model: the folder it converts into (once), as a run would
        if problem := lora_rank_refusal(cfg.model.lora.rank, path, shape.hidden):  # as train (cat13's n27)
            raise ConfigError(problem)
    except (ConfigError, FileNotFoundError, ValueError) as e:
        print(f"rlpost plan: {e}", file=sys.stderr)
        return 2
    gpu_gb, assumed = gpu_size(gpu_gb)
    plan = gpu_plan(cfg, shape, gpu_gb * GIB)
    print(plan_header(cfg, shape, gpu_gb, assumed))
    print(format_plan(plan))
    if cfg.trainer.device == "cuda":  # the update's fixed cost per micro-batch: fewer, larger ones pay
        budget, now = largest_token_budget(cfg, shape, gpu_gb * GIB), micro_batch_tokens(cfg)
        print(f"  the largest micro-batch that fits: {budget} tokens (trainer.max_tokens_per_microbatch; now {now})")
    try:
        check_plan(cfg, plan)
    except ConfigError as e:
        print(f"rlpost plan: {e}", file=sys.stderr)
        return 1
    return 0


def cmd_plot(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(
        prog="rlpost plot",
        description="PNG curves of runs side by side (reward, validation accuracy, KL, entropy, response "
        "length, step time by phase), or of a benchmark's JSON (its curves and tables).",
    )
    parser.add_argument("paths", nargs="+", help="run folders (with metrics.jsonl), or JSON files")
    parser.add_argument(
        "--out",
        default=None,
        help="the PNG (default: curves.png / compare.png in the first run's folder; x.png for x.json)",
    )
    args = parser.parse_args(argv)
    from rlpost.metrics.plot import plot_json, plot_runs

    jsons = [p for p in args.paths if Path(p).is_file() and p.endswith(".json")]
    try:
        if jsons and len(jsons) < len(args.paths):
            raise ValueError("give run folders or JSON files, not both")
        if jsons and args.out and len(jsons) > 1:
            raise ValueError("--out takes one JSON file's picture; leave it out for several")
        made = [plot_json(p, args.out) for p in jsons] if jsons else [plot_runs(args.paths, args.out)]
    except (FileNotFoundError, ValueError) as e:
        print(f"rlpost plot: {e}", file=sys.stderr)
        return 2
    except OSError as e:  # a folder it cannot write: PIL's traceback (the tenth catalogue's t45)
        print(
            f"rlpost plot: cannot write {e.filename} ({e.strerror}): "
            + ("free space there, or " if e.errno == errno.ENOSPC else "")
            + "give --out PATH somewhere writable",
            file=sys.stderr,
        )
        return 1
    for out, titles in made:
        print(f"{out}: {', '.join(titles)}")
    return 0


def cmd_doctor(argv: list[str]) -> int:
    from rlpost.doctor import doctor  # (rlpost/doctor.py: the installed packages, rlpost's version first)

    return doctor(argv)


def main(argv: list[str] | None = None) -> int:
    if argv is None:  # the command itself (not a test calling main): a console that cannot end the run
        from rlpost.console import steady_console

        steady_console()
    argv = sys.argv[1:] if argv is None else argv
    commands = {
        "train": cmd_train,
        "data": cmd_data,
        "export": cmd_export,
        "plan": cmd_plan,
        "plot": cmd_plot,
        "doctor": cmd_doctor,
    }
    if argv and argv[0] in ("-h", "--help", "help"):  # asked for: on stdout, exit 0
        print(__doc__.strip())
        return 0
    if argv and argv[0] in ("-V", "--version"):  # (the nineteenth catalogue's t125: there was no way to ask)
        from rlpost.doctor import version

        return print(version()) or 0
    if not argv or argv[0] not in commands:
        if argv:
            print(f"rlpost: unknown command {argv[0]!r}; the commands are {', '.join(commands)}\n", file=sys.stderr)
        print(__doc__.strip(), file=sys.stderr)
        return 2
    from rlpost.console import ConsoleError, working_folder_gone

    if gone := working_folder_gone():  # (the sixteenth catalogue's t129: MKL's fatal error as torch loaded)
        return print(f"rlpost: {gone}", file=sys.stderr) or 2
    try:
        return commands[argv[0]](argv[1:])
    except KeyboardInterrupt:  # before a command's own handling (the twelfth catalogue's t74: during the imports)
        started = " as it started: nothing was trained" if argv[0] == "train" else ""  # (its own handlers: later)
        print(f"\nrlpost {argv[0]}: interrupted (SIGINT){started}", file=sys.stderr)
        return 130
    except ConsoleError as e:  # said on the other stream (cat20's t122: stderr's went to /dev/null, not a word)
        with contextlib.suppress(ConsoleError, OSError):
            print(f"rlpost: {e}", file=sys.stdout if e.stream == "stderr" else sys.stderr, flush=True)
        return 1


if __name__ == "__main__":
    sys.exit(main())
