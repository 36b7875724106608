"""The shape of a decoder-only transformer, from its config.json or the tiny model's settings: what
the memory plan (`plan.py`) counts. Read: the hidden size, layers, MLP width, vocabulary, attention
and key/value heads, `head_dim` where the config gives it apart from hidden / heads (Qwen3, Gemma),
tied embeddings, and a mixture of experts (`num_local_experts` or `num_experts`, their
`moe_intermediate_size`, `num_experts_per_tok`): every expert's weights are held, a token's
activations go through its chosen experts only. A shared expert beside them is not counted."""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

from rlpost.config import TrainConfig

LORA_MODULES = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")
MLP = ("gate_proj", "up_proj", "down_proj")


@dataclass(frozen=True)
class ModelShape:
    hidden: int
    layers: int
    intermediate: int
    vocab: int
    heads: int
    kv_heads: int
    tied: bool
    head_dim: int = 0  # 0: hidden // heads
    experts: int = 1  # the MLPs of a layer (a mixture of experts: with a router)
    active_experts: int = 1  # the MLPs a token goes through

    @property
    def q_width(self) -> int:
        return self.heads * (self.head_dim or self.hidden // self.heads)

    @property
    def kv_width(self) -> int:
        return self.kv_heads * (self.head_dim or self.hidden // self.heads)

    def module_shapes(self) -> dict[str, tuple[int, int]]:
        """(in, out) of each linear layer of a decoder layer (one expert's MLP)."""
        h, q, kv, i = self.hidden, self.q_width, self.kv_width, self.intermediate
        return {
            "q_proj": (h, q),
            "k_proj": (h, kv),
            "v_proj": (h, kv),
            "o_proj": (q, h),
            "gate_proj": (h, i),
            "up_proj": (h, i),
            "down_proj": (i, h),
        }

    @property
    def layer_params(self) -> int:
        shapes = self.module_shapes()
        attention = sum(a * b for m, (a, b) in shapes.items() if m not in MLP)
        mlp = sum(a * b for m, (a, b) in shapes.items() if m in MLP)
        router = self.hidden * self.experts if self.experts > 1 else 0
        return attention + self.experts * mlp + router + self.q_width + 2 * self.kv_width + 2 * self.hidden

    @property
    def root_params(self) -> int:
        return self.vocab * self.hidden * (1 if self.tied else 2) + self.hidden

    @property
    def params(self) -> int:
        return self.layers * self.layer_params + self.root_params

    def lora_params(self, rank: int, targets: list) -> int:
        names = LORA_MODULES if "all-linear" in targets else [m for m in LORA_MODULES if m in targets]
        return self.layers * sum(rank * (a + b) for m, (a, b) in self.module_shapes().items() if m in names)

    def activation_bytes_per_token(self, dtype_bytes: int) -> int:
        """What one decoder layer keeps for the backward pass, per token: the inputs of its
        linear layers and attention (4 h + 2 q + 2 kv in the compute dtype), the MLP's 4 products
        in each expert the token goes through, and the two norms' float32 inputs."""
        h, i = self.hidden, self.intermediate * self.active_experts
        return dtype_bytes * (4 * h + 2 * self.q_width + 2 * self.kv_width + 4 * i) + 2 * 4 * h


def hub_config(repo_id: str) -> str:
    """A hub id's config.json in the Hugging Face cache ("": not a hub id); not cached, an error that says
    so: `check_hub_reachable`'s (offline, or no network), else that the plan downloads nothing (the
    sixteenth catalogue's t101: "no config.json there" read as if a folder existed)."""
    from huggingface_hub import try_to_load_from_cache

    from rlpost.models.loading import check_hub_reachable

    try:
        cached = try_to_load_from_cache(repo_id, "config.json")
    except ValueError:  # not a hub id
        return ""
    if isinstance(cached, str):
        return cached
    check_hub_reachable(repo_id)
    raise FileNotFoundError(
        f"model.path={repo_id!r} is not in the Hugging Face cache: the memory plan reads the model's config.json "
        f"and downloads nothing; `huggingface-cli download {repo_id} config.json` fills the cache"
    )


def model_shape(path: str) -> ModelShape:
    """The shape of the model in the local folder `path` (its `config.json`)."""
    file = Path(path).expanduser() / "config.json"
    if not file.is_file() and not Path(path).expanduser().exists():  # a hub id: its config in the cache
        file = Path(hub_config(path))
    if not file.is_file():
        raise FileNotFoundError(f"model.path={path!r}: no config.json there; the memory plan needs the model's folder")
    c = json.loads(file.read_text())
    c = c.get("text_config", c)
    try:
        heads, experts = c["num_attention_heads"], c.get("num_local_experts") or c.get("num_experts") or 1
        read = {
            "hidden_size": c["hidden_size"],
            "num_hidden_layers": c["num_hidden_layers"],
            "intermediate_size": (c.get("moe_intermediate_size") if experts > 1 else None) or c["intermediate_size"],
            "vocab_size": c["vocab_size"],
            "num_attention_heads": heads,
            "num_key_value_heads": c.get("num_key_value_heads") or heads,
            "head_dim": c.get("head_dim") or 0,
            "num_experts": experts,
            "num_experts_per_tok": (c.get("num_experts_per_tok") or 1) if experts > 1 else 1,
        }
    except KeyError as e:
        raise ValueError(f"{file}: no {e} (the memory plan reads decoder-only transformer configs)") from None
    for key, value in read.items():  # (a 0 or a null: a ZeroDivisionError or TypeError, the 18th catalogue's t04/t05)
        if type(value) is not int or value < (key != "head_dim"):  # head_dim 0: hidden // heads
            raise ValueError(f"{file}: {key}={value!r} is not a positive integer: no config the memory plan can read")
    hidden, layers, intermediate, vocab, heads, kv_heads, head_dim, experts, active = read.values()
    tied = bool(c.get("tie_word_embeddings", False))
    return ModelShape(hidden, layers, intermediate, vocab, heads, kv_heads, tied, head_dim, experts, active)


def shape_of(cfg: TrainConfig, path: str | None = None) -> ModelShape:
    """The policy's shape: `model.tiny` for the tiny model, else the config.json of the local
    folder `path` (default `model.path`)."""
    path = path or cfg.model.path
    if path == "tiny":
        from rlpost.tiny.model import build_char_tokenizer

        t = cfg.model.tiny
        vocab = len(build_char_tokenizer())
        return ModelShape(t.hidden_size, t.num_layers, t.intermediate_size, vocab, t.num_heads, t.num_kv_heads, True)
    return model_shape(path)
