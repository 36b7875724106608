#!/usr/bin/env python3
"""Planted bugs in `Batch`'s pickling (rlpost/data/batch.py), one at a time, against its test
(`tests/data/test_dataset.py -k pickled`). By hand rather than with mutmut (scripts/mutation.py):
`Batch` is used by nearly every test, and mutmut's clean run of that whole set in its fork server
fails here with no output (`Failed to run clean test`), while the same tests pass under pytest.

    python scripts/mutation_batch.py --out benchmarks/mutation_batch.json
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
SOURCE = REPO / "rlpost" / "data" / "batch.py"
TEST = ["tests/data/test_dataset.py", "-k", "pickled"]
MUTANTS = [  # (what the bug does, code, the code with the bug)
    ("a tensor with a gradient goes to numpy", 't.device.type != "cpu" or t.requires_grad', 't.device.type != "cpu"'),
    ("CPU tensors keep torch's pickling", 't.device.type != "cpu" or', 't.device.type == "cpu" or'),
    ("bfloat16 comes back as int16", "numpy(), t.dtype", "numpy(), None"),
    ("a read-only array is wrapped as it is", "array if array.flags.writeable else array.copy()", "array"),
    ("the dtype is not viewed back", "v = t if dtype is None else t.view(dtype)", "v = t"),
    ("no __reduce__: torch's pickling", "    def __reduce__(self):", "    def _reduce_off(self):"),
    ("the arrays stay arrays", "        if isinstance(v, tuple):", "        if False:"),
]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", required=True)
    args = ap.parse_args()
    original = SOURCE.read_text()
    results = []
    try:
        for name, code, bug in MUTANTS:
            if original.count(code) != 1:
                raise SystemExit(f"{name}: {code!r} is not in {SOURCE} exactly once")
            SOURCE.write_text(original.replace(code, bug))
            test = subprocess.run([sys.executable, "-m", "pytest", "-q", "-x", *TEST], cwd=REPO, capture_output=True)
            status = "killed" if test.returncode else "survived"
            results.append({"mutant": name, "code": code, "bug": bug, "status": status})
            print(name, results[-1]["status"], flush=True)
    finally:
        SOURCE.write_text(original)
    killed = sum(r["status"] == "killed" for r in results)
    out = {
        "command": f"python scripts/mutation_batch.py --out {args.out}",
        "test": " ".join(TEST),
        "killed": killed,
        "survived": len(results) - killed,
        "mutants": results,
    }
    Path(args.out).write_text(json.dumps(out, indent=1) + "\n")


if __name__ == "__main__":
    main()
