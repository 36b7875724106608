"""`trainer.profile_step`: one step's update under torch.profiler on each trainer rank, written to
the run folder as two tables (the operators by their own device time, then by their own CPU
time) and a trace that Perfetto or chrome://tracing opens. The update's parts are named in both
(`rlpost/forward`, `rlpost/reference`, `rlpost/backward`, `rlpost/optimizer_step`)."""

from __future__ import annotations

import gzip
import shutil
from contextlib import contextmanager, nullcontext
from pathlib import Path

import torch

ROWS = 40  # operators a table lists


def part(name: str):
    """A named range in the profile (nothing measurable when no profiler runs)."""
    return torch.profiler.record_function(f"rlpost/{name}")


@contextmanager
def profiled(folder: Path, name: str, cuda: bool):
    """The block under torch.profiler; `folder/name.txt` and `folder/name.json.gz` after it."""
    from torch.profiler import ProfilerActivity, profile

    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if cuda else [])
    with profile(activities=activities) as prof:
        yield
    folder.mkdir(parents=True, exist_ok=True)
    averages = prof.key_averages()
    tables = [("self CPU time", averages.table(sort_by="self_cpu_time_total", row_limit=ROWS))]
    if cuda:
        tables.insert(0, ("self device time", averages.table(sort_by="self_device_time_total", row_limit=ROWS)))
    text = "\n\n".join(f"# {name}: operators by {title}\n{table}" for title, table in tables)
    (folder / f"{name}.txt").write_text(text + "\n")
    trace = folder / f"{name}.json"
    prof.export_chrome_trace(str(trace))
    with open(trace, "rb") as src, gzip.open(f"{trace}.gz", "wb") as dst:
        shutil.copyfileobj(src, dst)
    trace.unlink()


def maybe_profiled(run_dir: str, profile_step: int, step: int, rank: int, cuda: bool):
    """`profiled` into `run_dir/profile/update_step{step}_rank{rank}` in the step `trainer.profile_step`
    names (`profile_step`; 0: none), else nothing."""
    if step != profile_step or profile_step <= 0:
        return nullcontext()
    return profiled(Path(run_dir) / "profile", f"update_step{step}_rank{rank}", cuda)
