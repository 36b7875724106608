"""Run folders as a run leaves them, for the tests of `rlpost.controller.run_dir` and the
catalogues' faults about run folders."""

from rlpost.config import load_config, to_yaml


def cfg_in(run_dir, *overrides):
    return load_config(["+recipe=quickstart", f"run.dir={run_dir}", *overrides])


def run_config(run_dir, *overrides):
    """The `config.yaml` a run writes first in its folder."""
    run_dir.mkdir(parents=True, exist_ok=True)
    (run_dir / "config.yaml").write_text(to_yaml(cfg_in(run_dir, *overrides)))


def earlier_run(run_dir):
    """What a run that got to step 2 leaves: its config, metrics, a checkpoint, a file of the user's."""
    run_config(run_dir)
    (run_dir / "checkpoints" / "step_2").mkdir(parents=True)
    (run_dir / "checkpoints" / "step_2" / "controller.pt").write_bytes(b"")  # what makes it a run's checkpoint
    (run_dir / "metrics.jsonl").write_text('{"step": 0}\n{"step": 1}\n{"step": 2}\n')
    (run_dir / "notes.txt").write_text("mine")
