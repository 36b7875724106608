#!/usr/bin/env python3
"""Planted bugs, one at a time, against the tests that must catch them: for code that mutmut
(benchmarks/mutation/mutation.py) cannot reach. `batch`: `Batch`'s pickling (used by nearly every test;
mutmut's clean run of that whole set fails in its fork server with no output, while the tests
pass under pytest). `edges`: the trainer's FSDP2 rule, the port picker and the reward pool's
alarm and trusted fast path, whose tests spawn processes (outside mutmut's test selection).
`layouts`: the shared-prompt layout and the layout rule.

    python benchmarks/mutation/mutation_by_hand.py batch --out benchmarks/mutation/mutation_batch.json
    python benchmarks/mutation/mutation_by_hand.py edges --out benchmarks/mutation/mutation_edges.json
    python benchmarks/mutation/mutation_by_hand.py layouts --out benchmarks/mutation/mutation_layouts.json
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO / "benchmarks"))
from provenance import with_provenance  # noqa: E402

BATCH = ("rlpost/data/batch.py", ["tests/data/test_dataset.py", "-k", "pickled"])
FSDP = ("rlpost/trainer/fsdp.py", ["tests/trainer/test_fsdp.py"])
PORTS = ("rlpost/weightsync/transport.py", ["tests/weightsync/test_weightsync.py", "-k", "free_ports"])
ALARM = ("rlpost/rewards/executor.py", ["tests/rewards/test_executor.py", "-k", "one_alarm"])
TRUSTED = ("rlpost/rewards/executor.py", ["tests/rewards/test_executor.py", "-k", "trusted_scorer_is_checked"])
SHARED = ("rlpost/trainer/logprobs.py", ["tests/trainer/test_logprobs.py"])
SETS = {  # set -> [((file, test), what the bug does, code, the code with the bug)]
    "batch": [
        (
            BATCH,
            "a tensor with a gradient goes to numpy",
            't.device.type != "cpu" or t.requires_grad',
            't.device.type != "cpu"',
        ),
        (BATCH, "CPU tensors keep torch's pickling", 't.device.type != "cpu" or', 't.device.type == "cpu" or'),
        (BATCH, "bfloat16 comes back as int16", "numpy(), t.dtype", "numpy(), None"),
        (BATCH, "a read-only array is wrapped as it is", "array if array.flags.writeable else array.copy()", "array"),
        (BATCH, "the dtype is not viewed back", "v = t if dtype is None else t.view(dtype)", "v = t"),
        (BATCH, "no __reduce__: torch's pickling", "    def __reduce__(self):", "    def _reduce_off(self):"),
        (BATCH, "the arrays stay arrays", "        if isinstance(v, tuple):", "        if False:"),
    ],
    "edges": [
        (FSDP, "plain at any world size", "dist.get_world_size() == 1 and compute_dtype", "compute_dtype"),
        (FSDP, "plain in any dtype", "== 1 and compute_dtype == torch.float32 and", "== 1 and"),
        (FSDP, "plain with CPU offload", "torch.float32 and not cpu_offload:", "torch.float32:"),
        (FSDP, "never plain", "    if dist.get_world_size() == 1 and", "    if False and"),
        (PORTS, "ports from the ephemeral range", "randrange(_LOWEST_PORT, start)", "randrange(_LOWEST_PORT, 60999)"),
        (PORTS, "ports below Ray's worker ports", "_LOWEST_PORT = 20000", "_LOWEST_PORT = 1024"),
        (PORTS, "the seeded random", "pick = random.SystemRandom()", "pick = random.Random(0)"),
        (PORTS, "no candidates: the kernel's choice", "if start > _LOWEST_PORT + 1000 else []", "if False else []"),
        (ALARM, "ends an item before its timeout", "if _running and now - _started >= _timeout_s:", "if _running:"),
        (
            ALARM,
            "not set again for the item under way",
            "    signal.setitimer(signal.ITIMER_REAL, max(left, 1e-4))",
            "    pass",
        ),
        (
            ALARM,
            "not set again after a timeout",
            "        signal.setitimer(signal.ITIMER_REAL, _timeout_s)  # for",
            "        pass  # for",
        ),
        (
            ALARM,
            "left armed after the chunk",
            "    finally:\n        signal.setitimer(signal.ITIMER_REAL, 0)",
            "    finally:\n        pass",
        ),
        (
            TRUSTED,
            "trusted values unchecked",
            "return scores if set(map(type, scores)) <= {float} and math.isfinite(sum(scores)) else None",
            "return scores",
        ),
        (TRUSTED, "no finite check", "<= {float} and math.isfinite(sum(scores)) else None", "<= {float} else None"),
        (TRUSTED, "no type check", "set(map(type, scores)) <= {float} and math", "math"),
    ],
    "layouts": [
        (
            SHARED,
            "responses' positions restart at 0",
            "position_ids=prompt_mask.sum(-1, keepdim=True) + torch.arange",
            "position_ids=0 * prompt_mask.sum(-1, keepdim=True) + torch.arange",
        ),
        (SHARED, "responses' logits one column late", ".logits[:, : R - 1]", ".logits[:, 1:R]"),
        (
            SHARED,
            "the prompts' padding attended",
            "distinct_mask = (distinct >= 0).long()",
            "distinct_mask = torch.ones_like(distinct)",
        ),
        (
            SHARED,
            "the responses attend to the prompts' padding",
            "attention_mask=torch.cat([prompt_mask, torch.nn",
            "attention_mask=torch.cat([torch.ones_like(prompt_mask), torch.nn",
        ),
        (
            SHARED,
            "the first token predicted from another prompt",
            ".logits[:, -1:][row_prompt]",
            ".logits[:, -1:][row_prompt.flip(0)]",
        ),
        (
            SHARED,
            "prompts told apart without their padding",
            'key = torch.where(prompt_mask, batch["prompt_ids"], -1)',
            'key = batch["prompt_ids"]',
        ),
        (
            SHARED,
            "shared_prompt on a GPU too",
            'return "shared_prompt" if device == "cpu" else "padded"',
            'return "shared_prompt"',
        ),
        (SHARED, "never shared", 'layout == "shared_prompt", {"logits_to_keep": 1}', 'False, {"logits_to_keep": 1}'),
        (
            SHARED,
            "the padded layout shares too",
            'layout == "shared_prompt", {"logits_to_keep": 1}',
            'True, {"logits_to_keep": 1}',
        ),
        (
            SHARED,
            "values never shared",
            'pieces = outputs_before_responses(model, batch, layout == "shared_prompt")',
            "pieces = outputs_before_responses(model, batch, False)",
        ),
        (
            SHARED,
            "the values' packed path returns nothing",
            "        out = packed_forward(model, p, device).logits[0, :, 0]",
            "        out = packed_forward(model, p, device).logits[0, :, 0] if False else None",
        ),
        (
            SHARED,
            "the cache argument's name the other way round",
            '"cache" if "cache" in inspect',
            '"cache" if "cache" not in inspect',
        ),
        (SHARED, "4.x's name misspelt", 'else "past_key_values"', 'else "PAST_KEY_VALUES"'),
        (
            SHARED,
            "a wrapper's own signature read",
            'model.get_base_model() if hasattr(model, "get_base_model")',
            "model.get_base_model() if False",
        ),
    ],
}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("set", choices=sorted(SETS))
    ap.add_argument("--out", required=True)
    args = ap.parse_args()
    results = []
    for (file, test), name, code, bug in SETS[args.set]:
        source = REPO / file
        original = source.read_text()
        if original.count(code) != 1:
            raise SystemExit(f"{name}: {code!r} is not in {file} exactly once")
        try:
            source.write_text(original.replace(code, bug))
            run = subprocess.run([sys.executable, "-m", "pytest", "-q", "-x", *test], cwd=REPO, capture_output=True)
        finally:
            source.write_text(original)
        status = "killed" if run.returncode else "survived"
        results.append(
            {"mutant": name, "file": file, "test": " ".join(test), "code": code, "bug": bug, "status": status}
        )
        print(name, status, flush=True)
    killed = sum(r["status"] == "killed" for r in results)
    out = {
        "command": f"python benchmarks/mutation/mutation_by_hand.py {args.set} --out {args.out}",
        "killed": killed,
        "survived": len(results) - killed,
        "mutants": results,
    }
    Path(args.out).write_text(json.dumps(with_provenance(out), indent=1) + "\n")


if __name__ == "__main__":
    main()
