"""What a run achieved, from its `metrics.jsonl`: the summary printed at the end of a run (and on a
clean stop) and written as `summary.json` in the run folder. Pure functions of the rows."""

from __future__ import annotations

import json
from pathlib import Path

# the controller's phases of a step (`timing_s/<phase>`; their sum is about `timing_s/step`);
# `update_worker`, `optimizer_step`, ... are parts of these and left out
PHASES = ("gen", "reward", "filter", "logprob", "values", "critic_update", "update", "weight_sync")
FAILURES = ("timeouts", "crashes", "bad_values")  # reward/<kind>: which of reward/errors (every failed sample)


def sweep_hint(folder: Path) -> str:
    """Where `folder` is a sweep's (its `multirun.yaml`), its runs' folders, said (the fifteenth catalogue's t50)."""
    if not (folder / "multirun.yaml").is_file():
        return ""
    runs = sorted((p for p in folder.iterdir() if p.is_dir() and p.name.isdigit()), key=lambda p: int(p.name))
    return f"; it is a sweep's folder (multirun.yaml): its runs are {', '.join(map(str, runs[:6])) or 'not started'}"


def read_metrics(run_dir: str | Path) -> list[dict]:
    """The rows of `run_dir/metrics.jsonl`, one per step (where a step was written twice, by an
    attempt that died before `trim_logs` ran, the last row wins), in step order."""
    path = Path(run_dir) / "metrics.jsonl"
    if Path(run_dir).name == "metrics.jsonl" and Path(run_dir).is_file():  # the eleventh catalogue's t67
        raise FileNotFoundError(f"{run_dir} is a run's metrics file: give its run folder, {Path(run_dir).parent}")
    if not path.is_file():
        raise FileNotFoundError(f"{run_dir}: no metrics.jsonl (is it a run folder?){sweep_hint(Path(run_dir))}")
    rows: dict[int, dict] = {}
    for n, line in enumerate(path.read_text().splitlines(), 1):
        if line.strip():
            try:
                row = json.loads(line)
                rows[int(row["step"])] = row
            except (json.JSONDecodeError, KeyError, TypeError, ValueError) as e:
                raise ValueError(f"{path} line {n}: not a metrics row ({e})") from None
    return [rows[s] for s in sorted(rows)]


def _mean(values: list[float]) -> float | None:
    return sum(values) / len(values) if values else None


def summarize(rows: list[dict], wall_s: float | None = None) -> dict:
    """Steps, time per phase, the validation curve's start, best and final, the reward's trend
    (mean of the first and of the last tenth of the steps, at least one step each) and the
    weight syncs done and verified."""
    steps = [r for r in rows if "timing_s/step" in r]
    val = [(r["step"], r["val/accuracy"]) for r in rows if r.get("val/accuracy") is not None]
    rewards = [r["reward/mean"] for r in steps if r.get("reward/mean") is not None]
    tenth = max(1, len(rewards) // 10)
    syncs = [r for r in steps if "weight_sync/version" in r]
    out = {
        "steps": len(steps),
        "last_step": steps[-1]["step"] if steps else 0,
        "wall_s": wall_s,
        "train_s": sum(r["timing_s/step"] for r in steps),
        "phase_s": {p: sum(r.get(f"timing_s/{p}", 0.0) for r in steps) for p in PHASES},
        "val_s": sum(r.get("timing_s/val", 0.0) for r in rows),
        "val_accuracy": {
            "start": val[0][1] if val else None,
            "best": max(v for _, v in val) if val else None,
            "best_step": max(val, key=lambda sv: sv[1])[0] if val else None,
            "final": val[-1][1] if val else None,
            "final_step": val[-1][0] if val else None,
        },
        "reward": {
            "first": _mean(rewards[:tenth]),
            "last": _mean(rewards[-tenth:]),
            "steps_averaged": tenth,
            "failed_samples": int(sum(r.get("reward/errors", 0.0) for r in steps)),  # (counted twice: cat11's t22)
            "failed_by_kind": {k: int(sum(r.get(f"reward/{k}", 0.0) for r in steps)) for k in FAILURES},
        },
        "weight_syncs": {
            "done": len(syncs),
            "verified": sum(r.get("weight_sync/verified", 0.0) > 0 for r in syncs),
        },
    }
    out["phase_s"] = {p: s for p, s in out["phase_s"].items() if s > 0}
    return out


def _duration(seconds: float) -> str:
    minutes, s = divmod(round(seconds), 60)
    return f"{minutes} min {s} s" if minutes else f"{seconds:.1f} s"


def format_summary(summary: dict, files: dict[str, str]) -> str:
    """The lines printed at the end of a run; `files`: what is where (checkpoints, metrics, ...)."""
    s = summary
    head = f"summary: {s['steps']} steps"
    if s["wall_s"] is not None:
        head += f" in {_duration(s['wall_s'])}"
    lines = [head]
    if s["train_s"] > 0:
        shares = ", ".join(f"{p} {100 * t / s['train_s']:.0f}%" for p, t in s["phase_s"].items())
        lines.append(f"  time: training {_duration(s['train_s'])} ({shares}); validation {_duration(s['val_s'])}")
    v = s["val_accuracy"]
    if v["start"] is not None:
        lines.append(
            f"  validation accuracy: start {v['start']:.3f}, best {v['best']:.3f} (step {v['best_step']}), "
            f"final {v['final']:.3f} (step {v['final_step']})"
        )
    r = s["reward"]
    if r["first"] is not None:
        n = r["steps_averaged"]
        failed, kinds = r.get("failed_samples", 0), r.get("failed_by_kind", {})
        which = ", ".join(f"{v} {k.replace('_', ' ')}" for k, v in kinds.items() if v)
        lines.append(
            f"  reward: {r['first']:.3f} (mean of the first {n} step{'s' * (n > 1)}) -> {r['last']:.3f} (the last)"
            + (f"; {failed} samples failed to score (reward/errors{': ' + which if which else ''})" if failed else "")
        )
    w = s["weight_syncs"]
    lines.append(f"  weight syncs: {w['done']} done, {w['verified']} verified by checksum")
    lines += [f"  {name}: {where}" for name, where in files.items()]
    return "\n".join(lines)


def write_report(run_dir: Path, wall_s: float, checkpoints: str, logger, log=print) -> dict:
    """At the end of a run or a clean stop: `summary.json` and (`logger.plot`) `curves.png` in
    `run_dir`, and the summary's lines through `log`; `checkpoints` says where they are. A run
    without metrics (no step ran) is summarised as having no steps. (`metrics.jsonl` is written
    whatever `logger.backends` says: the summary said "none written" without `jsonl` there, cat10's t73.)"""
    run_dir = Path(run_dir)
    rows = read_metrics(run_dir) if (run_dir / "metrics.jsonl").is_file() else []
    summary = summarize(rows, wall_s)
    files = {
        "checkpoints": checkpoints,
        "metrics": str(run_dir / "metrics.jsonl") if rows else "none yet (no step ran)",
        "summary": str(run_dir / "summary.json"),
    }
    try:  # the run's work is done and saved: a full disk here is one line of the summary (the sixteenth's t37)
        (run_dir / "summary.json").write_text(json.dumps(summary, indent=1) + "\n")
    except OSError as e:
        files["summary"] = f"not written ({e.strerror}: {e.filename})"
    if logger.plot and any(r["step"] > 0 for r in rows):  # (stopped in step 1: the start's row alone)
        try:
            from rlpost.metrics.plot import plot_runs

            files["curves"] = str(plot_runs([run_dir])[0])
        except ImportError as e:  # a machine without matplotlib still trains
            files["curves"] = f"not drawn ({e})"
        except OSError as e:  # no space left, a read-only folder (rlpost plot draws it later)
            files["curves"] = f"not drawn ({e.strerror}: {e.filename}); draw it later: rlpost plot {run_dir}"
        except ValueError as e:  # curves.png there is not a picture rlpost drew
            files["curves"] = f"not drawn ({e})"
    log(format_summary(summary, files))
    return summary
