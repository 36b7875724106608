"""The run loop's rows in `metrics.jsonl`: one per step. The engines' memory at the start is
step 0's row in a new run; in a resumed run it goes with the first new step, since a row at the
step resumed from would stand for that step's own row (summaries keep one row a step; on an H200
a resumed run's memory row replaced the saved step's metrics)."""

from types import SimpleNamespace

from rlpost.config import load_config
from rlpost.controller.progress import run_steps
from rlpost.metrics.summary import read_metrics


class FakeController:
    """What `run_steps` asks of a controller; each step's reward is its number."""

    def __init__(self, run_dir, step: int):
        self.cfg = load_config(
            [
                "trainer.total_steps=3",
                "trainer.val_every=0",
                "trainer.save_every=0",
                "trainer.start_pass_k=0",
                "logger.backends=[jsonl]",
                "logger.progress_bar=false",
                f"run.dir={run_dir}",
            ]  # fmt: skip
        )
        self.step, self.run_dir, self.model_path = step, run_dir, str(run_dir)
        self.algorithm = SimpleNamespace(name="grpo")
        memory = [{"rollout/gpu_used_gb": 5.0}]
        self.workers = SimpleNamespace(rollouts=SimpleNamespace(call=lambda method: memory))

    def train_step(self):
        return {"reward/mean": float(self.step + 1), "perf/tokens": 10.0}

    def report(self):
        pass


def test_a_new_run_logs_the_engines_memory_at_step_0(tmp_path):
    run_steps(FakeController(tmp_path, 0))
    rows = read_metrics(tmp_path)
    assert [r["step"] for r in rows] == [0, 1, 2, 3]
    assert rows[0] == {"step": 0, "rollout/gpu_used_gb": 5.0}
    assert [r["reward/mean"] for r in rows[1:]] == [1.0, 2.0, 3.0]


def test_a_resumed_run_logs_them_with_its_first_new_step(tmp_path):
    (tmp_path / "metrics.jsonl").write_text('{"step": 1, "reward/mean": 1.0}\n')  # the saved run's step 1
    run_steps(FakeController(tmp_path, 1))
    rows = read_metrics(tmp_path)
    assert [r["step"] for r in rows] == [1, 2, 3]
    assert rows[0] == {"step": 1, "reward/mean": 1.0}
    assert rows[1]["rollout/gpu_used_gb"] == 5.0 and rows[1]["reward/mean"] == 2.0
    assert "rollout/gpu_used_gb" not in rows[2]
