"""The order of the start on GPUs (`Workers.start`): colocated, the engines are made only after the
trainers answered (vLLM takes its share of what they leave, and the memory check names the knob
first); with `rollout.kv_cache_gb` set (vLLM profiles nothing) and split (GPUs of their own), the
engines load while the trainers do, and the check comes after. Ray, the placement and the actors
are stand-ins that write down what was asked of them."""

import pytest

from rlpost.config import load_config
from rlpost.controller import workers as workers_module
from rlpost.controller.workers import Workers


class Recorded:
    def __init__(self, events):
        self.events = events

    def group(self, cls, cfg, placement, bundles, role, args, log, **kw):
        self.events.append(f"made {role}")
        events = self.events

        class Group:
            deadlines = type("D", (), {})()

            def call(self, method, *a):
                events.append(f"{role}: {method}")
                return [[{"total": 80 * 2**30}]]

            def __len__(self):
                return len(bundles)

        return Group()


class FakePlacement:
    trainer_bundles, rollout_bundles = [0], [1]

    def address_of_bundle(self, bundle):
        return "127.0.0.1", 29500

    def engine_devices(self, cfg, trainers):
        return [None]


@pytest.fixture
def events(monkeypatch):
    events: list[str] = []
    monkeypatch.setattr(workers_module, "start_ray", lambda cfg, log: events.append("ray"))
    monkeypatch.setattr(workers_module.Placement, "create", classmethod(lambda cls, *a, **k: FakePlacement()))
    monkeypatch.setattr(workers_module, "WorkerGroup", Recorded(events).group)
    monkeypatch.setattr(workers_module, "Rollouts", lambda *a, **k: None)
    monkeypatch.setattr(workers_module, "WeightSync", lambda *a, **k: None)
    monkeypatch.setattr(workers_module, "replace", lambda deadlines, **k: deadlines)
    monkeypatch.setattr(Workers, "_check_memory", lambda self, cfg, path, log: events.append("trainer: memory_report"))
    monkeypatch.setattr(Workers, "pool", lambda self, cfg: None)
    return events


def start(placement: str, device: str = "cuda", backend: str = "vllm", kv_cache_gb: float = 0.0) -> Workers:
    cfg = load_config(["+recipe=quickstart", f"cluster.placement={placement}"], this_machine=False)
    cfg.trainer.device, cfg.rollout.backend, cfg.rollout.kv_cache_gb = device, backend, kv_cache_gb
    tokenizer = type("T", (), {"pad_token_id": 0, "eos_token_id": 1})()
    w = Workers()
    w.start(cfg, ("actor", "rollout"), "/model", tokenizer, None, None, print)
    return w


def test_colocated_engines_start_after_the_trainers_answered(events):
    w = start("colocate")
    assert events == ["ray", "made trainer", "trainer: memory_report", "made rollout"]
    assert set(w.start_s) == {"time/start_ray_s", "time/start_trainers_s", "time/start_engines_s"}


def test_colocated_engines_with_a_kv_cache_of_a_set_size_start_beside_the_trainers(events):
    start("colocate", kv_cache_gb=4.0)  # vLLM profiles no free memory: the trainers' loading cannot mislead it
    assert events == ["ray", "made trainer", "made rollout", "trainer: memory_report"]


def test_colocated_hf_engines_wait_whatever_kv_cache_gb_says(events):
    start("colocate", backend="hf", kv_cache_gb=4.0)  # a vLLM knob
    assert events == ["ray", "made trainer", "trainer: memory_report", "made rollout"]


def test_split_engines_load_while_the_trainers_do(events):
    w = start("split")
    assert events == ["ray", "made trainer", "made rollout", "trainer: memory_report"]
    assert set(w.start_s) == {"time/start_ray_s", "time/start_trainers_s", "time/start_engines_s"}


def test_on_the_cpu_nothing_waits_for_the_trainers(events):
    w = start("colocate", device="cpu")
    assert events == ["ray", "made trainer", "made rollout"]
    assert set(w.start_s) == {"time/start_ray_s", "time/start_engines_s"}
