"""Helpers shared by tests: a tiny model folder, one sync sent from a thread, reference log-probs."""

import threading

import torch

from rlpost.weightsync.manifest import manifest_of
from rlpost.weightsync.sync import receive_weights, send_weights
from rlpost.weightsync.transport import SyncGroup, free_port


def save_tiny_model(folder, seed: int = 0):
    """A random 2-layer Qwen2 (hidden 128: vLLM's CPU attention needs head_dim 32) and the
    character tokenizer, saved in `folder`; returns (model, tokenizer)."""
    from transformers import Qwen2ForCausalLM

    from rlpost.models.tiny import build_char_tokenizer, tiny_qwen2_config

    tok = build_char_tokenizer()
    torch.manual_seed(seed)
    model = Qwen2ForCausalLM(tiny_qwen2_config(len(tok), 128, 2, 4, 2, 256, 64, tok.pad_token_id,
                                               tok.eos_token_id)).eval()
    model.save_pretrained(folder)
    tok.save_pretrained(folder)
    return model, tok


def sync_from_thread(named, expected, load, loaded, version: int, bucket_bytes: int = 4096):
    """Send `named` (the trainer's side, in a thread) and receive it into an engine over gloo;
    returns the receiver's stats, after checking both sides counted the same bytes."""
    port, sent = free_port(), {}

    def sender():
        group = SyncGroup("127.0.0.1", port, 0, 2, "cpu", 60)
        sent["stats"] = send_weights(group, manifest_of(named), iter([t for _, t in named]), version, bucket_bytes)

    thread = threading.Thread(target=sender)
    thread.start()
    stats = receive_weights(SyncGroup("127.0.0.1", port, 1, 2, "cpu", 60), expected, version, load, loaded)
    thread.join()
    assert stats.bytes == sent["stats"].bytes
    return stats


def reference_logprobs(model, batch, temperature: float = 1.0, top_k: int = 0, top_p: float = 1.0) -> torch.Tensor:
    """Log-probs [B, R] of the generated tokens under softmax(logits / T) of `model`, one
    unpadded sequence at a time; with `top_k` / `top_p`, under that distribution restricted to
    the k most likely tokens, then to the nucleus (the smallest set whose mass reaches p), and
    renormalized (-inf for a token outside)."""
    out = torch.zeros_like(batch["rollout_logprobs"])
    for i in range(len(batch)):
        prompt = batch["prompt_ids"][i][batch["prompt_mask"][i]]
        response = batch["response_ids"][i][batch["response_mask"][i]]
        ids = torch.cat([prompt, response])[None]
        with torch.no_grad():
            logits = model(input_ids=ids).logits[0, len(prompt) - 1:-1].float() / temperature
        keep = torch.ones_like(logits, dtype=torch.bool)
        if top_k:
            keep &= logits >= logits.topk(top_k, dim=-1).values[:, -1:]
        if top_p < 1:
            probs = torch.softmax(logits.masked_fill(~keep, -torch.inf), -1)
            order = probs.sort(-1, descending=True)
            mass_above = order.values.cumsum(-1) - order.values  # mass of the tokens ranked above
            in_nucleus = torch.zeros_like(keep).scatter(-1, order.indices, mass_above < top_p)
            keep &= in_nucleus
        logprobs = torch.log_softmax(logits.masked_fill(~keep, -torch.inf), -1)
        out[i, : len(response)] = logprobs.gather(-1, response[:, None])[:, 0]
    return out


PROMPTS = ["12+34=", "7+70=", "99+1="]


def check_sampling(engine, model, tok, params, prompts=PROMPTS, atol: float = 1e-4):
    """`engine.generate` with `params` on a random model: every sampled token lies in the top-k /
    nucleus of softmax(logits / T) (greedy: is the argmax), and the reported log-probs are that
    truncated, renormalized distribution's. The same samples scored without the truncation would
    differ: the settings are not ignored."""
    batch = engine.generate([tok(p)["input_ids"] for p in prompts], params)
    mask = batch["response_mask"]
    assert mask.sum() >= len(prompts) * params.n  # something was generated
    temperature = 1.0 if params.greedy else params.temperature
    top_k = 1 if params.greedy else params.top_k
    ref = reference_logprobs(model, batch, temperature, top_k, params.top_p)
    assert torch.isfinite(ref[mask]).all(), "a sampled token lies outside the top-k / nucleus"
    if params.greedy:  # greedy reports softmax(logits) of the argmax
        ref = reference_logprobs(model, batch, 1.0)
    diff = (ref - batch["rollout_logprobs"]).abs()[mask]
    assert diff.max().item() < atol, diff.max()
    if (params.top_k or params.top_p < 1) and not params.greedy:
        untruncated = reference_logprobs(model, batch, temperature)
        assert (untruncated - batch["rollout_logprobs"]).abs()[mask].max() > 10 * atol
    if params.temperature != 1.0 and not params.greedy:
        at_one = reference_logprobs(model, batch, 1.0, params.top_k, params.top_p)
        assert (at_one - batch["rollout_logprobs"]).abs()[mask].nan_to_num(posinf=1.0).max() > 10 * atol
    return batch


def run_ranks(fn, world: int, *args) -> None:
    """`fn(rank, world, *args)` on every rank: world size 1 in this process, more as spawned
    processes. Under mutmut's stats run (`MUTANT_UNDER_TEST=stats`) the functions the spawned
    ranks ran are recorded as run by the calling test: mutmut records calls per process, and
    would otherwise never test its mutants there (scripts/mutation.py)."""
    if world == 1:
        threads = torch.get_num_threads()
        try:
            fn(0, 1, *args)
        finally:
            torch.set_num_threads(threads)
        return
    import json
    import os
    import tempfile
    from pathlib import Path

    import torch.multiprocessing as mp

    folder = tempfile.mkdtemp() if os.environ.get("MUTANT_UNDER_TEST") == "stats" else ""
    mp.spawn(_rank_entry, args=(fn, folder, world, *args), nprocs=world, join=True)
    if folder:
        from mutmut.state import state

        for path in Path(folder).glob("*.json"):
            state()._stats.update(json.loads(path.read_text()))


def _rank_entry(rank, fn, folder, world, *args):
    try:
        fn(rank, world, *args)
    finally:
        if folder:
            import json
            from pathlib import Path

            from mutmut.state import state

            Path(folder, f"{rank}.json").write_text(json.dumps(sorted(state()._stats)))
