"""The run loop around the step: the start's metrics (the start model's accuracy and headroom),
then steps until `trainer.total_steps` or a signal, each followed on schedule by validation and a
checkpoint, logged to the trackers and shown on the progress bar."""

from __future__ import annotations

import sys
import time
from pathlib import Path

from rlpost.config import config_dict
from rlpost.controller.alerts import Alerts
from rlpost.controller.signals import StopSignals
from rlpost.controller.step import idle_fractions, sampling_params
from rlpost.metrics.trackers import Trackers
from rlpost.rewards.executor import Interrupted
from rlpost.tiny.build import start_eval


def start_metrics(c) -> dict[str, float]:
    """The engines' memory; the start-up's phases (`time/start_*_s`: `Workers.lap`); at step 0 the start
    model's held-out greedy accuracy and pass@k (a built tiny model's from its own evaluation, a real
    model's measured here)."""
    cfg, k = c.cfg, c.cfg.trainer.start_pass_k
    out = engines_memory(c)
    if c.step == 0:  # (`start_pass_k` set: measured with the run's sampler, not the built model's own: cat14's t18)
        start = start_eval(c.model_path).items()
        out.update({f"start/{n}": float(v) for n, v in start if n == "greedy_accuracy" or (n[:5] == "pass@" and not k)})
        if cfg.trainer.val_every:
            out.update(c.validate())
        if k:
            params = sampling_params(cfg, cfg.run.seed, n=k, greedy=False)
            measured = c.workers.batches.pass_at_k(c.val_rows, params)
            out.update(measured)
            c.log(
                f"start model, {len(c.val_rows)} validation prompts, {k} samples each with the run's sampler: "
                + ", ".join(f"{name[6:]} {v:.3f}" for name, v in measured.items())
            )
    c.workers.lap("validation")  # the start's validation and pass@k (none when resumed)
    out.update(c.workers.start_s)
    c.log(start_line(c.workers.start_s))
    return out


def start_line(phases: dict[str, float]) -> str:
    """The start-up's phases in one console line: "start-up 79.4 s: prepare 2.0 s, ray 25.1 s, ..."."""
    named = ", ".join(f"{k[len('time/start_') : -len('_s')]} {v:.1f} s" for k, v in phases.items())
    return f"start-up {sum(phases.values()):.1f} s: {named}"


def engines_memory(c) -> dict[str, float]:
    """The rollout engines' GPU memory (`RolloutWorker.memory`), the largest figure of any engine."""
    return largest(c.workers.rollouts.call("memory"))


def largest(reports: list[dict[str, float]]) -> dict[str, float]:
    out: dict[str, float] = {}
    for report in reports:
        for k, v in report.items():
            out[k] = max(v, out.get(k, v))
    return out


def run_steps(c, stop: StopSignals | None = None) -> Path:
    """Train controller `c` from its step to the last; a signal stops it after the step under way.
    The handlers stay until the caller has shut the workers down (`rlpost.controller.run`): a
    signal during the report ended the process there, with no summary, the lock left and Ray's
    agents orphaned (the eleventh catalogue's t97)."""
    from tqdm import tqdm

    cfg = c.cfg
    lines = cfg.logger.progress_bar and not sys.stderr.isatty()  # a file takes a line a step, not the bar's frames
    bar = tqdm(total=cfg.trainer.total_steps, initial=c.step, desc=c.algorithm.name, dynamic_ncols=True,
               disable=not cfg.logger.progress_bar or lines)  # fmt: skip
    trackers = Trackers(cfg.logger.backends, c.run_dir, cfg.logger.project, cfg.logger.wandb_mode,
                        config=config_dict(cfg), write=tqdm.write)  # fmt: skip
    own, alerts = stop is None, Alerts(cfg, tqdm.write)
    stop = stop or StopSignals()
    try:
        first = start_metrics(c)
        if first and c.step == 0:
            trackers.log(first, 0)
            alerts.check_once(first)  # the start's validation
        # resumed: the engines' memory goes with the first new step (a row at the step resumed from
        # would stand for that step's own row, written by the run that saved it)
        pending = first if c.step > 0 else {}
        val_acc = first.get("val/accuracy")  # the bar shows the newest
        while c.step < cfg.trainer.total_steps and stop.signal is None:
            check_run_folder(c.run_dir, c.step, tqdm.write)
            try:
                metrics, pending = {**pending, **timed_step(c)}, {}
            except Interrupted:  # the signal came while the step's samples were scored: the step is given up
                c.log(f"the signal stopped step {c.step + 1}'s scoring: the step is not trained")
                break
            trackers.log(metrics, c.step)
            alerts.check(c.step, metrics)  # a step that could not learn is said at once
            val_acc = metrics.get("val/accuracy", val_acc)
            shown = postfix(metrics, val_acc)
            bar.set_postfix(**shown)
            bar.update(1)
            if lines:
                tqdm.write(
                    f"{c.algorithm.name} step {c.step}/{cfg.trainer.total_steps}: "
                    + ", ".join(f"{k} {v}" for k, v in shown.items())
                )
        if stop.signal is not None and c.step < cfg.trainer.total_steps:
            c.stop_on(stop.signal)
        stop.finishing = True
    finally:
        bar.close()
        trackers.close()
        if own:  # (a caller without its own handlers: tests)
            stop.restore()
    c.report()
    return c.run_dir


def postfix(metrics: dict[str, float], val_acc: float | None) -> dict[str, str]:
    """What the bar shows after a step (and the line a step that replaces it in a file)."""
    acc = {"val_acc": f"{val_acc:.3f}"} if val_acc is not None else {}
    return {"reward": f"{metrics['reward/mean']:.3f}", **acc, "step_s": f"{metrics['timing_s/step']:.2f}"}


def check_run_folder(run_dir: Path, step: int, log=print) -> None:
    """The run's folder (its config.yaml) must still be there: one deleted under a run made it write
    its later checkpoints into a new folder no command could read, and end with exit 0. Its lock
    must still be this run's (`run_lock.keep_lock`)."""
    from rlpost.controller.checkpoint import CheckpointError
    from rlpost.controller.run_lock import keep_lock

    if not (run_dir / "config.yaml").is_file():
        raise CheckpointError(
            f"the run folder {run_dir} (its config.yaml) is gone, deleted or moved after step {step} while the run "
            "trained: stopped, as nothing it would write there could be read again; if you moved it, go on there "
            "with trainer.resume=auto run.dir=<its new path>; if it was deleted, start the run again in a folder "
            "that stays"
        )
    keep_lock(run_dir, step, log)


def run_time_at(run_dir: Path, step: int) -> float:
    """`time/run_s` of `step`'s row in the run's metrics (0 where the step's row has none: a run
    logged before it was written): where a resumed run's wall time goes on from."""
    from rlpost.metrics.summary import read_metrics

    rows = [r for r in read_metrics(run_dir) if r["step"] == step] if (run_dir / "metrics.jsonl").is_file() else []
    return float(rows[0].get("time/run_s", 0.0)) if rows else 0.0


def timed_step(c) -> dict[str, float]:
    """One step of `c` with its time and tokens/s, then validation and a checkpoint when due, and the
    run's wall time so far (`time/run_s`: Ray's and the models' start, every step, validation and
    checkpoint; a run resumed by a new process goes on from the resumed step's figure, so the time
    of steps lost after the last checkpoint and the downtime are not in it)."""
    cfg, start = c.cfg, time.perf_counter()
    metrics = c.train_step()
    c.step += 1
    if cfg.trainer.device == "cuda":  # what a sleeping engine keeps: the plan's colocated peak leaves it out
        metrics.update(engines_memory(c))  # timed with the step: a wait here is the step's (async_h200x4.json)
    metrics["timing_s/step"] = time.perf_counter() - start
    metrics["perf/tokens_per_s"] = metrics.pop("perf/tokens") / metrics["timing_s/step"]
    metrics.update(idle_fractions(cfg, metrics))
    last = c.step == cfg.trainer.total_steps
    if cfg.trainer.val_every and (c.step % cfg.trainer.val_every == 0 or last):
        metrics.update(c.validate())
    if cfg.trainer.save_every and (c.step % cfg.trainer.save_every == 0 or last):
        c.save()
    metrics["time/run_s"] = time.monotonic() - c.started  # wall time: the x axis of accuracy against time
    return metrics
