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


def reference_logprobs(model, batch, temperature: float = 1.0) -> torch.Tensor:
    """Log-probs [B, R] of the generated tokens under softmax(logits / T) of `model`, one
    unpadded sequence at a time."""
    out = torch.zeros_like(batch["rollout_logprobs"])
    for i in range(len(batch)):
        prompt = batch["prompt_ids"][i][batch["prompt_mask"][i]]
        response = batch["response_ids"][i][batch["response_mask"][i]]
        ids = torch.cat([prompt, response])[None]
        with torch.no_grad():
            logits = model(input_ids=ids).logits[0, len(prompt) - 1:-1].float() / temperature
        out[i, : len(response)] = torch.log_softmax(logits, -1).gather(-1, response[:, None])[:, 0]
    return out
