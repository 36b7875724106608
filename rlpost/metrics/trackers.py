"""Where metrics go: console, `metrics.jsonl`, tensorboard, wandb (offline by default).

Every tracker takes `log(metrics, step)` with a flat dict of floats and `close()`.
`metrics.jsonl` gets one JSON object per step, with the step under `"step"`. `TRACKERS` holds a
factory per name of `logger.backends`, from the run's `TrackerRun` to the tracker.
"""

from __future__ import annotations

import errno
import json
import os
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

from rlpost.registry import Registry

CONSOLE_KEYS = (
    "reward/mean",
    "val/accuracy",
    "actor/pg_loss",
    "actor/kl",
    "actor/grad_norm",
    "response_length/mean",
    "timing_s/step",
)


class JsonlTracker:
    def __init__(self, run_dir: Path):
        self.file = RowFile(run_dir / "metrics.jsonl")

    def log(self, metrics: dict, step: int) -> None:
        """A row a step; a value that is not finite is written as it is (NaN, Infinity: Python's
        `json` reads them back), not as null, which read as "not logged" (the fourteenth catalogue's t06)."""
        self.file.append(json.dumps({"step": step, **metrics}) + "\n", step)

    def close(self) -> None:
        self.file.close()


class RowFile:
    """A log of JSON rows, each appended whole or not at all: a full disk (or a lost folder) leaves
    no half row behind, and stops the run naming the file (each row is one unbuffered write)."""

    def __init__(self, path: Path):
        self.path, self.fd = path, os.open(path, os.O_RDWR | os.O_APPEND | os.O_CREAT, 0o644)

    def append(self, line: str, step: int) -> None:
        if os.fstat(self.fd).st_nlink == 0 and self.path.parent.is_dir():
            self.restore()
        data, end = line.encode(), os.fstat(self.fd).st_size
        try:
            while data:
                data = data[os.write(self.fd, data) :]
        except OSError as e:
            try:
                os.ftruncate(self.fd, end)  # the part that fit goes too
            except OSError:
                pass
            full = e.errno in (errno.ENOSPC, errno.EDQUOT)  # else not "free space" (the twelfth catalogue's t100)
            fix = "free space there" if full else "make it writable"
            raise TrackerError(
                f"cannot write step {step}'s row to {self.path} ({e.strerror}): {fix} (or choose another "
                "run.dir) and go on from the newest checkpoint with trainer.resume=auto"
            ) from None

    def restore(self) -> None:
        """The file was deleted while the run wrote it (its rows went on into the unlinked file: the
        fourteenth catalogue's t27): written again at its path from what this process still holds."""
        rows = os.pread(self.fd, os.fstat(self.fd).st_size, 0)
        fd = os.open(self.path, os.O_RDWR | os.O_APPEND | os.O_CREAT, 0o644)
        os.write(fd, rows)
        os.close(self.fd)
        self.fd = fd
        rows_n = len(rows.splitlines())
        print(f"rlpost: {self.path} was deleted during the run: written again ({rows_n} rows)", file=sys.stderr)

    def close(self) -> None:
        if self.fd is not None:
            os.close(self.fd)
            self.fd = None


def trim_logs(run_dir: Path, step: int) -> None:
    """Before a run (re)starts at `step` in `run_dir`: `metrics.jsonl` and `samples.jsonl` keep
    only the rows of steps 0..`step` (what a resumed run will not write again; a fresh start,
    `step` 0, keeps none), so that each step has exactly one row whatever attempts came before.
    Rewritten atomically."""
    for name in ("metrics.jsonl", "samples.jsonl"):
        path = run_dir / name
        if not path.is_file():
            continue
        lines = path.read_text().splitlines(keepends=True)
        kept = [line for line in lines if step > 0 and line.strip() and json.loads(line)["step"] <= step]
        if len(kept) != len(lines):
            tmp = path.with_suffix(".tmp")
            tmp.write_text("".join(kept))
            tmp.replace(path)


class SampleLog:
    """`samples.jsonl`: the first `per_step` samples of every step (prompt, response, reward), one
    JSON object each, so that what the model wrote can be read next to the metrics."""

    def __init__(self, run_dir: Path, per_step: int):
        self.path, self.per_step, self.file = run_dir / "samples.jsonl", per_step, None

    def write(self, step: int, rows: list, n: int, responses: list[str], rewards: list[float]) -> None:
        """`rows`: the step's prompts (`prompt_text`), each sampled `n` times: response i is row i // n's."""
        if not self.per_step:
            return
        self.file = self.file or RowFile(self.path)
        for i, (response, reward) in enumerate(list(zip(responses, rewards))[: self.per_step]):
            prompt = rows[i // n].prompt_text
            row = json.dumps({"step": step, "prompt": prompt, "response": response, "reward": reward})
            self.file.append(row + "\n", step)

    def close(self) -> None:
        if self.file:
            self.file.close()
            self.file = None


class ConsoleTracker:
    """A line per validation and every `every` steps (the progress bar shows the rest)."""

    def __init__(self, write=print, every: int = 10):
        self.write, self.every = write, every

    def log(self, metrics: dict, step: int) -> None:
        if step % self.every and "val/accuracy" not in metrics:
            return
        parts = [f"{k} {metrics[k]:.4g}" for k in CONSOLE_KEYS if k in metrics]
        if not parts:
            return
        self.write(f"step {step}: " + "  ".join(parts))

    def close(self) -> None:
        pass


class TensorboardTracker:
    def __init__(self, run_dir: Path):
        try:
            from torch.utils.tensorboard import SummaryWriter
        except Exception as e:  # noqa: BLE001  (installed, but broken: said in a line, cat15's t54)
            raise TrackerError(
                f"logger.backends has tensorboard, which cannot be imported ({e}): pip install tensorboard"
            )

        self.writer = SummaryWriter(log_dir=str(run_dir / "tensorboard"))

    def log(self, metrics: dict, step: int) -> None:
        for k, v in metrics.items():
            self.writer.add_scalar(k, v, step)
        self.writer.flush()

    def close(self) -> None:
        self.writer.close()


class TrackerError(RuntimeError):
    """A tracker could not start (the message names the `logger` setting and what to do)."""


WANDB_RUNS = "wandb_runs.txt"  # the W&B runs a run made under its wandb/, a folder name a line


class WandbTracker:
    def __init__(self, run_dir: Path, project: str, mode: str, config: dict):
        try:
            import wandb
        except Exception as e:  # noqa: BLE001  (installed, but broken: said in a line, cat15's t54)
            raise TrackerError(
                f"logger.backends has wandb, which cannot be imported ({e}): pip install wandb"
            ) from None

        said = os.environ.get("WANDB_MODE")
        if said and said != mode:  # wandb's own line then said to set WANDB_MODE, already set (cat10's t17)
            print(
                f"warning: WANDB_MODE={said} is set, and logger.wandb_mode={mode} decides: set logger.wandb_mode={said}"
            )
        try:
            self.run = wandb.init(
                project=project, dir=str(run_dir), mode=mode, config=config, name=run_dir.name, reinit="finish_previous"
            )
            if getattr(self.run, "dir", None):  # what run.overwrite=true may delete of wandb/ (cat16's t88)
                with open(run_dir / WANDB_RUNS, "a") as f:
                    f.write(Path(self.run.dir).parent.name + "\n")
        except Exception as e:  # noqa: BLE001  (wandb's own error types: no key, no network, a bad project)
            raise TrackerError(
                f"logger.wandb_mode={mode}: wandb could not start ({type(e).__name__}: {str(e).strip()}); run `wandb "
                "login` and check the network, or set logger.wandb_mode=offline (sync later with `wandb sync`)"
            ) from e

    def log(self, metrics: dict, step: int) -> None:
        self.run.log(metrics, step=step)

    def close(self) -> None:
        self.run.finish()


@dataclass(frozen=True)
class TrackerRun:
    """What a tracker is made from: the run's folder and the `logger` settings."""

    run_dir: Path
    project: str
    wandb_mode: str
    config: dict
    write: Callable[[str], None]


TRACKERS: Registry[Callable[[TrackerRun], object]] = Registry("tracker", key="logger.backends")
TRACKERS.register("console", lambda run: ConsoleTracker(run.write))
TRACKERS.register("jsonl", lambda run: JsonlTracker(run.run_dir))
TRACKERS.register("tensorboard", lambda run: TensorboardTracker(run.run_dir))
TRACKERS.register("wandb", lambda run: WandbTracker(run.run_dir, run.project, run.wandb_mode, run.config))


class Trackers:
    def __init__(
        self,
        backends: list[str],
        run_dir: Path,
        project: str = "rlpost",
        wandb_mode: str = "offline",
        config: dict | None = None,
        write=print,
    ):
        run = TrackerRun(run_dir, project, wandb_mode, config or {}, write)
        # metrics.jsonl always: the summary, `rlpost plot`, the start's report and a resume read it
        self.trackers = [TRACKERS.get(name)(run) for name in dict.fromkeys([*backends, "jsonl"])]

    def log(self, metrics: dict, step: int) -> None:
        for t in self.trackers:
            t.log(metrics, step)

    def close(self) -> None:
        for t in self.trackers:
            t.close()
