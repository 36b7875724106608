"""What rlpost runs inside each of vLLM's workers when the engine is tensor parallel
(`rollout.tensor_parallel_size` > 1): vLLM adds these methods to its worker class
(`worker_extension_cls`) and the engine calls them on every worker at once (`collective_rpc`).

Each worker (one shard) is a member of the weight-sync group itself: it receives every tensor
whole, loads it through vLLM's own loaders (each layer keeps its shard) and checks the slice it
keeps against that slice of what it received (`rlpost.rollout.vllm_shards`,
`rlpost.weightsync.sync.receive_weights`). A method here never raises: vLLM's multiprocessing
executor reads the workers' replies in order and raises at the first failure, which would leave
the others' replies unread; so a failure comes back as {"error": message} and the engine raises.
"""

from __future__ import annotations

import traceback

from rlpost.rollout.vllm_shards import layer_of
from rlpost.rollout.vllm_weights import shard_view, vllm_module


def refresh_tied_head(worker) -> None:
    """After a reload: an output head that shares the embedding's parameter (Llama's tying;
    Qwen2's head is the embedding module itself) loads no weights of its own, so vLLM does not
    process it again, and a kernel that keeps a processed copy of the weight (the CPU backend
    packs it for its GEMM) would go on with the old embedding. Process it again."""
    model = worker.model_runner.get_model()
    head, embed = getattr(model, "lm_head", None), getattr(getattr(model, "model", None), "embed_tokens", None)
    method = getattr(head, "quant_method", None)
    if None in (head, embed, method) or head is embed or getattr(head, "weight", None) is not embed.weight:
        return
    method.process_weights_after_loading(head)


def held_parameters(worker) -> dict:
    """The worker's parameters by name, each with the layer that holds it (the shard rules' view)."""
    model = worker.model_runner.get_model()
    modules = dict(model.named_modules())
    return {n: (p, layer_of(modules[n.rpartition(".")[0]])) for n, p in model.named_parameters()}


def tp_rank() -> int:
    from vllm.distributed import get_tensor_model_parallel_rank

    return get_tensor_model_parallel_rank()


class SyncExtension:
    """Methods vLLM adds to its worker (`self` is the worker: `self.model_runner`, `self.device`)."""

    def rlpost_join_sync(self, addresses: list[tuple], device: str, timeout_s: int, transport: str) -> dict:
        """Join the sync group this shard belongs to: `addresses[tp_rank]` = (host, port, rank, world)."""
        from rlpost.weightsync.transport import SyncGroup

        try:
            host, port, rank, world = addresses[tp_rank()]
            self.rlpost_group = SyncGroup(host, port, rank, world, device, timeout_s, transport)
            return {"rank": rank}
        except Exception:  # noqa: BLE001 - returned, not raised (see the module's docstring)
            return {"error": traceback.format_exc(limit=4)}

    def rlpost_parameter_names(self) -> list[str]:
        """The shard's parameters' names (what the engine asks of a worker in another process)."""
        return [n for n, _ in self.model_runner.get_model().named_parameters()]

    def rlpost_receive(self, version: int, manifest: list, lora_wrapped: set) -> dict:
        """One sync of the whole model into this shard: {"stats": its `SyncStats`}, or {"error": message}."""
        from rlpost.weightsync.sync import receive_weights

        by_name = {s.name: s for s in manifest}
        before, held = held_parameters(self), {}

        def load(named):
            self.reload_weights(weights_iterator=((base_layer_name(n, lora_wrapped), t) for n, t in named))
            refresh_tied_head(self)
            held.update(held_parameters(self))  # a reload may give the layers new parameters

        def loaded(name):
            found = shard_view(held, by_name, name)
            return None if found is None else found[0]

        def part(name):  # asked before the load
            found = shard_view(before, by_name, name)
            s = None if found is None else found[1]
            whole = s is None or (s.full, s.length) == (0, by_name[name].shape[s.dim])
            return None if whole else (s.dim, s.full, s.length)

        try:
            stats = receive_weights(self.rlpost_group, manifest, version, load, loaded, part)
            return {"stats": stats, "shard": tp_rank()}
        except Exception as e:  # noqa: BLE001 - returned, not raised (see the module's docstring)
            return {"error": str(e), "type": type(e).__name__, "shard": tp_rank()}


def base_layer_name(hf_name: str, lora_wrapped: set) -> str:
    """`...q_proj.weight` -> `...q_proj.base_layer.weight` where vLLM wrapped the module for LoRA
    (its loader maps q_proj to qkv_proj itself)."""
    if vllm_module(hf_name) not in lora_wrapped:
        return hf_name
    module, _, leaf = hf_name.rpartition(".")
    return f"{module}.base_layer.{leaf}"
