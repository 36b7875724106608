"""`rlpost train`'s own flags beside the Hydra overrides, as Hydra's apps have them: `--help`,
`--cfg job` (the composed config) and `-m`/`--multirun` (a sweep: each `key=a,b`, `range()` or
`choice()` override expands with Hydra's own parser, and the runs go one after another into
numbered folders under one sweep folder). Pure functions; the CLI runs what they return."""

from __future__ import annotations

import itertools
import math
from dataclasses import dataclass, field, fields
from datetime import datetime
from pathlib import Path

from rlpost.config.schema import ConfigError, TrainConfig

FLAGS = ("-h", "--help", "--cfg", "-c", "-m", "--multirun")
MAX_SWEEP_JOBS = 1000  # a sweep runs its jobs one after another, each checked before the first starts


@dataclass
class TrainArgs:
    overrides: list[str] = field(default_factory=list)
    help: bool = False
    show_config: bool = False
    multirun: bool = False


def parse_train_args(argv: list[str]) -> TrainArgs:
    """Split `rlpost train`'s arguments into its flags and the Hydra overrides."""
    args, words = TrainArgs(), list(argv)
    while words:
        word = words.pop(0)
        if word in ("-h", "--help"):
            args.help = True
        elif word in ("-m", "--multirun"):
            args.multirun = True
        elif word in ("--cfg", "-c") or word.startswith("--cfg="):
            what = word.split("=", 1)[1] if "=" in word else (words.pop(0) if words else "")
            if what != "job":
                raise ConfigError(
                    f"--cfg {what or '(nothing)'}: rlpost prints only the run's own config, `--cfg job` "
                    "(Hydra's `hydra` and `all` parts are not rlpost's: it composes without Hydra's app)"
                )
            args.show_config = True
        elif word.startswith("-"):
            raise ConfigError(
                f"unknown option {word!r} for `rlpost train`: it takes Hydra overrides (key=value, "
                f"+recipe=NAME) and {', '.join(FLAGS)}; see `rlpost train --help`"
            )
        elif word.lstrip("+~").startswith("hydra."):
            key = word.lstrip("+~").partition("=")[0]
            raise ConfigError(
                f"{key}: rlpost composes its config without Hydra's app, so Hydra's own settings are not used; "
                "the run folder is run.dir=PATH (a sweep's runs go into numbered folders under it)"
            )
        else:
            args.overrides.append(word)
    return args


def repeated_keys(overrides: list[str]) -> list[str]:
    """A key given more than once (`trainer.total_steps=2 ... trainer.total_steps=3`): the last
    value is used, as Hydra does, and each such key is said with its values."""
    values: dict[str, list[str]] = {}
    for override in overrides:
        key, eq, value = override.lstrip("+~").partition("=")
        if eq:
            values.setdefault(key, []).append(value)
    repeated = [(key, v) for key, v in values.items() if len(v) > 1 and key != "recipe"]  # (refused: load_config)
    return [f"{key} given {len(v)} times ({', '.join(v)}): the last, {v[-1]}, is used" for key, v in repeated]


def sweep_jobs(overrides: list[str]) -> list[list[str]]:
    """Every combination of a sweep's values, as one override list a run (Hydra's basic sweeper's
    order: the first swept key changes slowest)."""
    from hydra.core.override_parser.overrides_parser import OverridesParser

    try:
        parsed = OverridesParser.create().parse_overrides(overrides=overrides)
    except Exception as e:  # Hydra's grammar errors
        raise ConfigError(f"cannot read the sweep {overrides}: {e}") from e
    choices = []
    for o in parsed:
        key = o.get_key_element()
        if o.is_sweep_override():
            choices.append([f"{key}={v}" for v in swept_values(o, key)])
        else:
            choices.append([o.input_line])
    if math.prod(len(c) for c in choices) > MAX_SWEEP_JOBS:  # (the fourteenth catalogue's t04: a MemoryError)
        swept = [f"{c[0].split('=', 1)[0]} ({len(c) if len(c) <= MAX_SWEEP_JOBS else 'more than 1000'})"
                 for c in choices if len(c) > 1]  # fmt: skip
        raise ConfigError(
            f"a sweep of more than {MAX_SWEEP_JOBS} jobs (values of {', '.join(swept)}): its runs go one after "
            "another; sweep fewer values, or split it into several sweeps with their own run.dir"
        )
    return [list(job) for job in itertools.product(*choices)]


def swept_values(o, key: str) -> list[str]:
    """The values of one swept override (no more than a whole sweep may have: range(0,10**8) is lazy);
    a sweep with no values, one of the optimizer sweepers' intervals, or a value listed twice is
    refused by its key (the fifteenth catalogue's t10, t09, t09b)."""
    text = o.input_line.partition("=")[2]
    try:
        values = list(itertools.islice(o.sweep_string_iterator(), MAX_SWEEP_JOBS + 1))
    except Exception as e:  # Hydra's: "Can only enumerate CHOICE and RANGE sweeps" (interval(...)), a bad range
        kind = getattr(getattr(o, "value_type", None), "name", "")
        why = {
            "INTERVAL_SWEEP": ": an interval is for an optimizing sweeper (Optuna, Nevergrad), not run by rlpost",
            "GLOB_CHOICE_SWEEP": ": glob() picks among a config group's options, which rlpost's sweeps do not expand; "
            "list them (+recipe=quickstart,rloo)",
        }.get(kind, "")
        said = "" if kind == "GLOB_CHOICE_SWEEP" else f" {str(e).splitlines()[0]};"  # ("ConfigLoader is not set")
        raise ConfigError(
            f"{key}={text}:{said} `rlpost train -m` runs listed values (a,b,c), range() or choice(){why}"
        ) from None
    if not values:
        raise ConfigError(
            f"{key}={text} has no values (a range counts up from its start: range(1,5), or range(5,1,-1))"
        )
    twice = sorted({v for v in values if values.count(v) > 1})
    if twice:
        raise ConfigError(f"{key}={text} lists {', '.join(twice)} more than once: the jobs would repeat each other")
    return values


def sweep_folder(run_dir: str) -> Path:
    """Where a sweep's runs go: `run.dir` as given, else runs/<date>_<time>_multirun."""
    return Path(run_dir or f"runs/{datetime.now():%Y%m%d_%H%M%S}_multirun").expanduser().resolve()


def train_help(recipes: list[str]) -> str:
    sections = "\n".join(f"  {f.name:12s} {f.metadata.get('help', '')}" for f in fields(TrainConfig))
    return f"""usage: rlpost train [OVERRIDE ...] [--cfg job] [-m | --multirun] [-h | --help]

Train with Hydra overrides: `+recipe=NAME` picks a recipe, `section.key=value` sets a key
(e.g. rlpost train +recipe=quickstart trainer.total_steps=20).

options:
  --cfg job       print the composed config (YAML) and exit
  -m, --multirun  a sweep: each `key=a,b` (or range(1,4), choice(a,b)) expands; the runs go one after
                  another into RUN_DIR/0, RUN_DIR/1, ... (RUN_DIR: run.dir, else runs/<date>_<time>_multirun)
  -h, --help      this help

recipes (+recipe=NAME): {", ".join(recipes)}

config sections (every key: docs/configuration.md, or `rlpost doctor --config-docs`):
{sections}
"""
