import pytest


@pytest.fixture(scope="session")
def ray_session():
    """One Ray instance for every integration test (starting Ray costs seconds)."""
    import ray

    from rlpost.config import load_config
    from rlpost.controller.cluster import actor_env, workers_at_normal_priority

    workers_at_normal_priority()
    ray.init(
        num_cpus=4,
        include_dashboard=False,
        log_to_driver=False,
        runtime_env={"env_vars": actor_env(load_config(["+recipe=quickstart"]))},
    )
    yield
    ray.shutdown()


@pytest.fixture(scope="session")
def tiny_cache(tmp_path_factory):
    """A cache folder with a tiny model built by a short warm-up (shared by all tests)."""
    return str(tmp_path_factory.mktemp("rlpost-cache"))


@pytest.fixture(scope="session")
def base_overrides(tiny_cache):
    """Overrides for a small, fast run in `run_dir` (a function of the run folder)."""
    return lambda run_dir: [
        "+recipe=quickstart",
        f"model.cache_dir={tiny_cache}",
        "model.tiny.warmup_steps=30",
        f"run.dir={run_dir}",
        "data.train_batch_size=8",
        "rollout.n=4",
        "data.val_size=32",
        "trainer.val_every=1",
        "logger.progress_bar=false",
        "logger.plot=false",  # drawn and checked by the quickstart's test
        "trainer.optim.lr=1e-3",
        # one trainer rank: each actor costs seconds to start on 2 cores; the tests of what two
        # ranks do (sharding, collectives, sharded checkpoints, merging LoRA) ask for two
        "trainer.world_size=1",
    ]
