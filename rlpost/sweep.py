"""`rlpost train -m ...`: Hydra's multirun, one job after another, each `rlpost train` in a process of
its own (in SWEEP/0, SWEEP/1, ...), with a signal to the sweep passed on to the job under way."""

from __future__ import annotations

import signal
import subprocess
import sys


def train_sweep(overrides: list[str], show_config: bool) -> int:
    """Hydra's multirun: every combination of the swept values, checked first, then one run after
    another (each its own process) in SWEEP/0, SWEEP/1, ...; stops at the first run that fails."""
    import yaml

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
        folder = sweep_folder(compose(jobs[0]).run.dir)
    except ConfigError as e:
        print(f"rlpost: config error: {e}", file=sys.stderr)
        return 2
    if (folder / "multirun.yaml").exists():
        print(
            f"rlpost: a sweep already ran in {folder} (multirun.yaml); give the new one another run.dir",
            file=sys.stderr,
        )
        return 2
    jobs = [
        [o for o in job if not o.startswith("run.dir=")] + [f"run.dir={folder / str(i)}"] for i, job in enumerate(jobs)
    ]
    configs = [checked_config(job) for job in jobs]
    if any(c is None for c in configs):
        return 2
    if show_config:
        print("\n".join(f"# job {i}: {' '.join(job)}\n{to_yaml(c)}" for i, (job, c) in enumerate(zip(jobs, configs))))
        return 0
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "multirun.yaml").write_text(yaml.safe_dump([{"job": i, "overrides": j} for i, j in enumerate(jobs)]))
    for i, job in enumerate(jobs):
        print(f"rlpost: sweep job {i + 1} of {len(jobs)}: {' '.join(job)}", flush=True)
        code, signum = run_job(job)
        if signum is not None and code == 0:  # the job had finished when the signal came
            print(f"rlpost: sweep stopped by {signal.Signals(signum).name} after job {i} ended", file=sys.stderr)
            if i + 1 == len(jobs):
                return 0
            print(f"rlpost: jobs {i + 1}.. did not run; the sweep's folder: {folder}", file=sys.stderr)
            return 128 + signum
        if signum is not None:
            print(
                f"rlpost: sweep stopped by {signal.Signals(signum).name} in job {i} (exit {code}); jobs {i + 1}.. "
                f"did not run; to go on with job {i}: rlpost train {' '.join(job)} trainer.resume=auto",
                file=sys.stderr,
            )
            return 128 + signum
        if code != 0:
            print(f"rlpost: sweep job {i} failed (exit {code}); jobs {i + 1}.. did not run ({folder})", file=sys.stderr)
            return code
    return 0


def run_job(job: list[str]) -> tuple[int, int | None]:
    """One job in a process of its own: (its exit code, the signal that stopped the sweep). SIGTERM,
    SIGINT or SIGHUP to the sweep go on to the job, which stops after its step as a single run does,
    and the sweep waits for it: the sweep had exited at once and left the job training with no
    parent (the tenth catalogue's t39)."""
    child = subprocess.Popen([sys.executable, "-m", "rlpost.cli", "train", *job])
    got: list[int] = []

    def forward(signum, frame):
        got.append(signum)
        child.send_signal(signum)

    stops = [signal.SIGTERM, signal.SIGINT, signal.SIGHUP]
    before = {s: signal.signal(s, forward) for s in stops if signal.getsignal(s) is not signal.SIG_IGN}
    try:
        return child.wait(), (got[0] if got else None)
    finally:
        for s, handler in before.items():
            signal.signal(s, handler)
