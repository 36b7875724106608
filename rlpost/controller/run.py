"""`train(cfg)`: a run from start to end. Signals stop it cleanly (`controller/signals.py`); when
an actor or its node dies, the worker groups start again from the newest complete checkpoint, at
most `trainer.max_restarts` times."""

from __future__ import annotations

import time
from dataclasses import replace
from pathlib import Path

from rlpost.config import TrainConfig
from rlpost.controller.loop import Controller
from rlpost.controller.signals import StopSignals


def train(cfg: TrainConfig, log=print) -> Path:
    """Run `cfg` to its last step. SIGTERM / SIGINT (from here on) stop it cleanly after the step
    under way, with a checkpoint: `Stopped`; a second one stops at once: KeyboardInterrupt. When an
    actor dies (`trainer.max_restarts` > 0 times at most) the groups start again and the run
    resumes from its newest complete checkpoint."""
    stop = StopSignals()
    restarts, started = 0, time.monotonic()
    try:
        while True:
            controller = Controller(cfg, log=log, restarts=restarts, stop=stop, started=started)
            try:
                if stop.signal is not None:  # arrived while the workers started
                    controller.stop_on(stop.signal)
                return controller.run(stop)
            except Exception as e:
                if stop.signal is not None and is_ray_error(e):  # the signal took the workers too
                    controller.stop_on(stop.signal, workers_gone=True)
                dead = controller.dead_actors() if is_ray_error(e) else []
                if not dead or restarts >= cfg.trainer.max_restarts:
                    raise
                restarts += 1
                log(
                    f"{', '.join(dead)} died ({type(e).__name__}); restart {restarts} of "
                    f"trainer.max_restarts={cfg.trainer.max_restarts} from the newest complete checkpoint"
                )
                cfg = replace(  # the same run, from its newest complete checkpoint
                    cfg, trainer=replace(cfg.trainer, resume="auto"), run=replace(cfg.run, dir=str(controller.run_dir))
                )
            finally:
                controller.shutdown()
    finally:
        stop.restore()


def is_ray_error(e: BaseException | None) -> bool:
    """Whether `e` is, or was caused by, an error of Ray (an actor that died, a lost node): a
    checkpoint that could not be written because its actors are gone is one too."""
    import ray

    while e is not None:
        if isinstance(e, ray.exceptions.RayError):
            return True
        e = e.__cause__
    return False


__all__ = ["train"]
