"""`train(cfg)`: a run from start to end. Signals stop it cleanly (`controller/signals.py`); when
an actor or its node dies, the worker groups start again from the newest complete checkpoint, at
most `trainer.max_restarts` times."""

from __future__ import annotations

import time
from dataclasses import replace
from pathlib import Path

from rlpost.config import TrainConfig
from rlpost.controller.checkpoint import CheckpointError
from rlpost.controller.loop import Controller
from rlpost.controller.progress import run_time_at
from rlpost.controller.signals import StopSignals, WorkersGone


def train(cfg: TrainConfig, log=print) -> Path:
    """Run `cfg` to its last step. SIGTERM / SIGINT (from here on) stop it cleanly after the step
    under way, with a checkpoint: `Stopped`; a second one stops at once: KeyboardInterrupt. When an
    actor dies (`trainer.max_restarts` > 0 times at most) the groups start again and the run
    resumes from its newest complete checkpoint."""
    from rlpost.controller.cluster import local_ray_died

    stop = StopSignals()
    stop.ray_gone = local_ray_died
    restarts, started = 0, time.monotonic()
    try:
        while True:
            try:
                controller = Controller(cfg, log=log, restarts=restarts, stop=stop, started=started)
            except Exception as e:  # (cat20's t55: Ray's raylet died as the actors started, a raw traceback)
                if restarts == 0 and stop.signal is None and died(e):  # (an actor's own error: its traceback)
                    raise died_starting(cfg, e) from e
                raise
            if restarts == 0 and controller.step > 0:  # resumed by a new process: its time goes on from the step's
                started = controller.started = started - run_time_at(controller.run_dir, controller.step)
            try:
                if stop.signal is not None:  # arrived while the workers started
                    controller.stop_on(stop.signal)
                return controller.run(stop)
            except Exception as e:
                if stop.signal is not None and (is_ray_error(e) or isinstance(e, WorkersGone)):  # it took them too
                    controller.stop_on(stop.signal, workers_gone=True)
                dead = controller.dead_actors() if is_ray_error(e) else []
                if isinstance(e, CheckpointError) and not dead:  # a full disk: no worker died (cat11's t73)
                    raise
                if is_ray_error(e) and (not dead or restarts >= cfg.trainer.max_restarts):
                    raise workers_died(cfg, controller, dead, restarts, e) from e
                if not dead:
                    raise
                restarts += 1
                log(
                    f"{', '.join(dead)} died ({type(e).__name__}); restart {restarts} of "
                    f"trainer.max_restarts={cfg.trainer.max_restarts} from the newest complete checkpoint"
                )
                cfg = replace(  # the same run, from its newest complete checkpoint
                    cfg, trainer=replace(cfg.trainer, resume="auto"), run=replace(cfg.run, dir=str(controller.run_dir))
                )
            finally:  # a signal now is said and the shutdown finishes (cut short, Ray's agents outlived it: t187)
                stop.finishing = True
                controller.shutdown()
                stop.finishing = False
    finally:
        stop.restore()


class WorkersDied(RuntimeError):
    """Actors or a node of the run died and no restart is left: what died, and how to go on."""


def workers_died(cfg: TrainConfig, controller: Controller, dead: list[str], restarts: int, e: Exception):
    """The run's end when its actors died: which, why (Ray's first line), the newest complete
    checkpoint and the command that goes on from it."""
    from rlpost.controller.checkpoint import complete_checkpoints

    newest = complete_checkpoints(controller.run_dir)[-1:]
    why = (str(e).strip().splitlines() or [""])[0][:200]
    left = f"after {restarts} restarts; " if restarts else ""
    go_on = (  # (with none, nothing to go on from: the seventeenth catalogue's t71)
        f"Its newest complete checkpoint: {newest[0]}; to go on from it, run the same command with "
        f"trainer.resume=auto run.dir={controller.run_dir} (trainer.max_restarts=N restarts by itself)"
        if newest
        else "No checkpoint was written, so nothing to go on from: run it again (here with run.overwrite=true); "
        "trainer.save_every=N and trainer.max_restarts=N let a run go on after this"
    )
    return WorkersDied(
        f"{', '.join(dead) or 'a Ray worker or node of the run'} died ({type(e).__name__}: {why}); the run stopped "
        f"{left}after step {controller.step}. {go_on}" + episodes_hint(cfg, dead)
    )


def died(e: BaseException) -> bool:
    """Whether `e` is a Ray process or node that died (not an error raised in an actor's own code)."""
    import ray.exceptions as x

    deaths = (x.ActorDiedError, x.ActorUnavailableError, x.NodeDiedError, x.WorkerCrashedError, x.LocalRayletDiedError)
    return isinstance(e, deaths)


def died_starting(cfg: TrainConfig, e: Exception) -> WorkersDied:
    """A Ray worker or node that died while the run's actors started: said in a line, with Ray's logs."""
    from rlpost.controller.ray_checks import ray_temp_root

    why = (str(e).strip().splitlines() or [""])[0][:200]
    logs = "on the cluster's head node" if cfg.cluster.address else f"in {ray_temp_root()}/ray/session_latest/logs"
    return WorkersDied(
        f"a Ray worker or node of the run died while its actors started ({type(e).__name__}: {why}); no step was "
        f"trained in this start. Why is in Ray's logs, {logs} (raylet.out first)"
    )


def episodes_hint(cfg: TrainConfig, dead: list[str]) -> str:
    """A rollout actor runs env.name's episodes in its own process: a step that ends that process
    is said as a likely cause, which a restart meets again (the eleventh catalogue's t34)."""
    if not cfg.env.name or not any(d.startswith("rollout") for d in dead):
        return ""
    return (
        f". The rollout actors run env.name={cfg.env.name}'s episodes: an episode step that ends its process "
        "(os._exit, a crash in native code) kills the actor the same way after every restart"
    )


def is_ray_error(e: BaseException | None) -> bool:
    """Whether `e` is, or was caused by, an error of Ray (an actor that died, a lost node): a
    checkpoint that could not be written because its actors are gone is one too."""
    import ray

    while e is not None:
        if isinstance(e, ray.exceptions.RayError):
            return True
        e = e.__cause__
    return False


__all__ = ["WorkersDied", "train"]
