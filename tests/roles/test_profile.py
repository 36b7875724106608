"""`trainer.profile_step`: the update of that step, and only that one, runs under torch.profiler
and leaves its tables and trace in the run folder, with the update's parts named."""

import gzip
import json

import torch

from rlpost.config import load_config
from rlpost.weightsync.transport import free_port
from tests.helpers import ragged_generation, reference_logprobs, save_tiny_model

COMMON = ["+recipe=quickstart", "trainer.world_size=1", "data.train_batch_size=4", "rollout.n=2"]


def test_the_named_step_is_profiled_into_the_run_folder(tmp_path):
    from rlpost.controller.step import step_plan
    from rlpost.data.microbatch import shard_batch
    from rlpost.roles.actor import ActorWorker

    model, _ = save_tiny_model(tmp_path / "model")
    cfg = load_config(COMMON + ["algo.kl_coef=0.1", f"run.dir={tmp_path / 'run'}", "trainer.profile_step=3"])
    batch, g = ragged_generation(0)
    batch["rollout_logprobs"] = reference_logprobs(model, batch, 1.0)
    batch["advantages"] = torch.randn(8, generator=g)
    shard = shard_batch(batch, step_plan(batch, cfg)[1])[0]
    worker = ActorWorker(cfg, str(tmp_path / "model"), 0, 1, "127.0.0.1", free_port())
    folder = tmp_path / "run" / "profile"
    try:
        worker.update(shard.select(slice(None)), False, 2)
        assert not folder.exists()
        worker.update(shard.select(slice(None)), False, 3)
    finally:
        worker.shutdown()
    assert sorted(p.name for p in folder.iterdir()) == ["update_step3_rank0.json.gz", "update_step3_rank0.txt"]
    table = (folder / "update_step3_rank0.txt").read_text()
    assert table.startswith("# update_step3_rank0: operators by self CPU time")  # no device table on the CPU
    for part in ("forward", "reference", "backward", "optimizer_step"):
        assert f"rlpost/{part}" in table, part
    with gzip.open(folder / "update_step3_rank0.json.gz") as f:
        names = {e.get("name") for e in json.load(f)["traceEvents"]}
    assert {"rlpost/forward", "rlpost/backward", "aten::mm"} <= names
