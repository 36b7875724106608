"""The real controller on a simulated two-node Ray cluster (`ray.cluster_utils.Cluster`, 2 CPUs a
node): where `cluster.placement` puts the trainer ranks and the rollout actors.

The cluster runs in a child process (this file run as a script) with a Ray temp folder of its own:
the controller connects to it through `cluster.address`, and neither the session-wide Ray of
`conftest.py` (one per pytest process) nor any other Ray on the machine sees it (a cluster writes
its address into `<temp>/ray/ray_current_cluster`, where a plain `ray.init()` would find it).
"""

import json
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

pytestmark = [pytest.mark.integration, pytest.mark.slow]

REPO = Path(__file__).resolve().parents[2]


def _node_ids(group) -> list[str]:
    import ray

    return ray.get([w.__ray_call__.remote(lambda self: ray.get_runtime_context().get_node_id()) for w in group.workers])


def _place(cfg, train_step: bool = False) -> dict:
    """Start the controller (workers + first weight sync), report each actor's node, stop it."""
    from rlpost.controller.loop import Controller

    controller = Controller(cfg, log=lambda *_: None)
    try:
        out = {"trainers": _node_ids(controller.trainers), "rollouts": _node_ids(controller.rollouts)}
        if train_step:
            metrics = controller.train_step()
            out["weight_sync/version"] = metrics["weight_sync/version"]
        return out
    finally:
        controller.shutdown()


def _child(overrides: list[str], run_root: str) -> dict:
    """Runs in the child process: two nodes, then split, colocate, and colocate over both nodes."""
    import ray
    from ray.cluster_utils import Cluster
    from ray.util.placement_group import placement_group, remove_placement_group

    from rlpost.config import load_config

    cluster = Cluster(initialize_head=True, head_node_args={"num_cpus": 2, "include_dashboard": False})
    second = cluster.add_node(num_cpus=2)
    cluster.wait_for_nodes()
    common = [
        "trainer.world_size=2",
        "rollout.num_workers=2",
        "trainer.val_every=0",
        f"cluster.address={cluster.address}",
    ]

    def cfg(name, placement):
        return load_config(overrides + common + [f"run.dir={run_root}/{name}", f"cluster.placement={placement}"])

    try:
        result = {"nodes": {"head": cluster.head_node.node_id, "second": second.node_id}}
        # the controller's own ray.init(address=...) connects to the cluster; it stays connected
        result["split"] = _place(cfg("split", "split"), train_step=True)
        result["connected_to"] = ray.get_runtime_context().gcs_address
        result["address"] = cluster.address
        result["colocate"] = _place(cfg("colocate", "colocate"))
        # one CPU taken on each node: the two colocate bundles can only go one to a node
        blocker = placement_group([{"CPU": 1}, {"CPU": 1}], strategy="STRICT_SPREAD")
        ray.get(blocker.ready(), timeout=60)
        result["colocate_spread"] = _place(cfg("colocate_spread", "colocate"))
        remove_placement_group(blocker)
        return result
    finally:
        ray.shutdown()
        cluster.shutdown()


# out of CI for time: bundle_layout and engine_devices are checked without Ray in tests/controller/test_plans.py
@pytest.mark.demo
def test_placement_across_two_nodes(base_overrides, tiny_cache, tmp_path):
    ray_tmp = tempfile.mkdtemp(prefix="rlpost-mn-", dir="/tmp")  # short: Ray's socket paths live here
    env = dict(
        os.environ,
        RAY_TMPDIR=ray_tmp,
        PYTHONPATH=os.pathsep.join(filter(None, [str(REPO), os.environ.get("PYTHONPATH")])),
    )
    args = json.dumps({"overrides": base_overrides(tmp_path / "unused"), "run_root": str(tmp_path)})
    try:
        proc = subprocess.run(
            [sys.executable, __file__, args], cwd=REPO, env=env, capture_output=True, text=True, timeout=300
        )
    finally:
        shutil.rmtree(ray_tmp, ignore_errors=True)
    lines = [line for line in proc.stdout.splitlines() if line.startswith("RESULT ")]
    assert proc.returncode == 0 and lines, (
        f"child failed ({proc.returncode}):\n{proc.stdout[-4000:]}\n{proc.stderr[-4000:]}"
    )
    r = json.loads(lines[-1][len("RESULT ") :])
    both = set(r["nodes"].values())
    assert len(both) == 2
    assert r["connected_to"] == r["address"]  # cluster.address was used, not a local Ray

    # split: trainer bundles first, then rollout bundles; 4 one-CPU bundles fill the two nodes,
    # so both trainer ranks share one node and both rollout actors the other
    s = r["split"]
    assert len(set(s["trainers"])) == 1 and len(set(s["rollouts"])) == 1, s
    assert {s["trainers"][0], s["rollouts"][0]} == both, s
    assert s["weight_sync/version"] == 1  # one step, weights synced across the nodes

    # colocate: rollout actor i shares bundle i with trainer rank i (same node); PACK puts the two
    # bundles on one node when it has room
    c = r["colocate"]
    assert c["rollouts"] == c["trainers"] and len(set(c["trainers"])) == 1, c

    # colocate when no node has room for both bundles: the ranks are on different nodes and each
    # rollout actor still follows its trainer rank
    c = r["colocate_spread"]
    assert set(c["trainers"]) == both and c["rollouts"] == c["trainers"], c


if __name__ == "__main__":
    spec = json.loads(sys.argv[1])
    print("RESULT " + json.dumps(_child(spec["overrides"], spec["run_root"])), flush=True)
