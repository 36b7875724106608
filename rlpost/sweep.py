"""`rlpost train -m ...`: Hydra's multirun, one job after another, each `rlpost train` in a process of
its own (in SWEEP/0, SWEEP/1, ...), with a signal to the sweep passed on to the job under way."""

from __future__ import annotations

import signal
import subprocess
import sys

from rlpost.controller.signals import STOPS


def train_sweep(overrides: list[str], show_config: bool) -> int:
    """Hydra's multirun: every combination of the swept values, checked first, then one run after
    another (each its own process) in SWEEP/0, SWEEP/1, ...; stops at the first run that fails.
    With `trainer.resume=auto` a stopped sweep goes on: the jobs `multirun.yaml` records as done
    are passed over, the others resume (a stopped sweep could not go on: the twelfth catalogue's t105)."""
    from rlpost.cli import checked_config
    from rlpost.config import ConfigError, compose, to_yaml
    from rlpost.config.command_line import sweep_folder, sweep_jobs

    try:
        jobs = sweep_jobs(overrides)
        dirs = sorted({o for job in jobs for o in job if o.startswith("run.dir=")})
        if len(dirs) > 1:  # each job would take the first's folder
            raise ConfigError(
                f"run.dir is swept ({', '.join(d.split('=', 1)[1] for d in dirs)}): a sweep's runs go into numbered "
                "folders under one run.dir; give one, and sweep other keys"
            )
        first = compose(jobs[0])
        folder = sweep_folder(first.run.dir)
        jobs = [
            [o for o in job if not o.startswith("run.dir=")] + [f"run.dir={folder / str(i)}"]
            for i, job in enumerate(jobs)
        ]
        done = jobs_done(folder, jobs, resume="trainer.resume=auto" in overrides, overwrite=first.run.overwrite)
    except ConfigError as e:
        print(f"rlpost: config error: {e}", file=sys.stderr)
        return 2
    if len(jobs) > 20:  # each config is checked first: seconds each (the fourteenth catalogue's t05)
        print(f"rlpost: a sweep of {len(jobs)} jobs: checking each config before the first starts", file=sys.stderr)
    configs = [checked_config(job) for job in jobs]
    if any(c is None for c in configs):
        return 2
    if show_config:
        print("\n".join(f"# job {i}: {' '.join(job)}\n{to_yaml(c)}" for i, (job, c) in enumerate(zip(jobs, configs))))
        return 0
    folder.mkdir(parents=True, exist_ok=True)
    go_on = "to go on with the sweep: rlpost train -m " + " ".join(without_resume(overrides))
    return run_jobs(jobs, folder, done, go_on + " trainer.resume=auto")


def jobs_done(folder, jobs: list[list[str]], resume: bool, overwrite: bool = False) -> set[int]:
    """The jobs of the sweep in `folder` that have finished: none for a new sweep, or one started
    again with `run.overwrite=true` (its record written anew, each job's folder overwritten by its
    run: the fifteenth catalogue's t11); for one that goes on (`resume`), those `multirun.yaml` says
    are done, where it lists these jobs."""
    import yaml

    from rlpost.config import ConfigError

    record = folder / "multirun.yaml"
    if not record.exists() and any((folder / name).exists() for name in ("config.yaml", "metrics.jsonl")):
        raise ConfigError(  # (the fifteenth catalogue's t66: the jobs went inside a run's folder)
            f"run.dir={folder} holds a run (config.yaml, metrics.jsonl), not a sweep: give the sweep a folder of its "
            "own"
        )
    if not record.exists() or overwrite:
        return set()
    try:
        saved, why = yaml.safe_load(record.read_text()) or [], "not a list of its jobs"
    except (yaml.YAMLError, UnicodeDecodeError) as e:
        saved, why = None, str(e).splitlines()[0]
    if not (isinstance(saved, list) and all(isinstance(s, dict) and "job" in s for s in saved)):
        raise ConfigError(  # (the fourteenth catalogue's t03: a raw traceback)
            f"{record} is not a sweep's record ({why}): "
            "it was cut short or written by hand; for a new sweep give another run.dir, or move the file away"
        )
    if not resume or [s.get("overrides") for s in saved] != [without_resume(j) for j in jobs]:
        raise ConfigError(
            f"a sweep already ran in {folder} (multirun.yaml)" + (", with other jobs than these" if resume else "")
            + "; to go on with it, give its command again with trainer.resume=auto; for a new sweep, another run.dir"
        )  # fmt: skip
    return {s["job"] for s in saved if s.get("done")}


def again_if_unsaved(job: list[str], job_dir) -> list[str]:
    """A job the sweep goes on with (`trainer.resume=auto`) whose folder holds its steps but no complete
    checkpoint (it died before its first) starts again over its own logs, `run.overwrite=true`: a resume
    is refused there (the fifteenth catalogue's t42), and the folder is this sweep's job's."""
    from rlpost.controller.checkpoint import complete_checkpoints

    if "trainer.resume=auto" not in job or complete_checkpoints(job_dir) or not (job_dir / "metrics.jsonl").exists():
        return job
    return [o for o in job if o != "trainer.resume=auto"] + ["run.overwrite=true"]


def run_jobs(jobs: list[list[str]], folder, done: set[int], go_on: str) -> int:
    """Each job not `done`, one after another, recorded in `multirun.yaml` as it ends; the sweep's exit code."""
    write_record(folder / "multirun.yaml", jobs, done)  # (before the first job: a stopped sweep is one too)
    for i, job in enumerate(jobs):
        which = f"sweep job {i} ({i + 1} of {len(jobs)})"  # its folder's number (one numbering: cat18's t33)
        if i in done:
            print(f"rlpost: {which}: done before, in {folder / str(i)}", flush=True)
            continue
        print(f"rlpost: {which}: {' '.join(job)}", flush=True)
        code, signum = run_job(again_if_unsaved(job, folder / str(i)))
        done |= {i} if code == 0 else set()
        write_record(folder / "multirun.yaml", jobs, done)
        name = signal.Signals(signum).name if signum is not None else ""
        left = f"; jobs {i + 1}.. did not run" if i + 1 < len(jobs) else ""
        if signum is not None and code == 0:  # the job had finished when the signal came
            print(f"rlpost: sweep stopped by {name} after job {i} ended", file=sys.stderr)
            if i + 1 == len(jobs):
                return 0
            print(f"rlpost: {left[2:]}; the sweep's folder: {folder}; {go_on}", file=sys.stderr)
            return 128 + signum
        if signum is not None:
            print(f"rlpost: sweep stopped by {name} in job {i} (exit {code}){left}; {go_on}", file=sys.stderr)
            return 128 + signum
        if code != 0:
            print(
                f"rlpost: sweep job {i} failed (exit {code}){left} ({folder}); once it is fixed, {go_on}",
                file=sys.stderr,
            )
            return code
    return 0


def without_resume(job: list[str]) -> list[str]:
    """`job` without `trainer.resume=auto`, and without `run.overwrite=true`, which would start a
    done job again and is refused beside a resume (the eighteenth catalogue's t97)."""
    return [o for o in job if o not in ("trainer.resume=auto", "run.overwrite=true")]


def write_record(record, jobs: list[list[str]], done: set[int]) -> None:
    """`multirun.yaml`: each job's overrides and whether it has finished (a sweep that goes on passes those)."""
    import yaml

    record.write_text(
        yaml.safe_dump([{"job": i, "overrides": without_resume(j), "done": i in done} for i, j in enumerate(jobs)])
    )


def run_job(job: list[str]) -> tuple[int, int | None]:
    """One job in a process of its own: (its exit code, the signal that stopped the sweep). The stop
    signals (`rlpost.controller.signals.STOPS`) to the sweep go on to the job, which stops after its
    step as a single run does, and the sweep waits for it: the sweep had exited at once and left the
    job training with no parent (the tenth catalogue's t39)."""
    # a session of its own: a signal to the sweep's whole group (`timeout`, Slurm) reaches the job once, forwarded,
    # not twice, which would stop it at once
    child = subprocess.Popen([sys.executable, "-m", "rlpost.cli", "train", *job], start_new_session=True)
    got: list[int] = []

    def forward(signum, frame):
        got.append(signum)
        child.send_signal(signum)

    before = {s: signal.signal(s, forward) for s in STOPS if signal.getsignal(s) is not signal.SIG_IGN}
    try:
        return child.wait(), (got[0] if got else None)
    finally:
        for s, handler in before.items():
            signal.signal(s, handler)
