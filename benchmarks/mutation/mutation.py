#!/usr/bin/env python3
"""Mutation score of the code where a silent bug ruins training (mutmut 3; `[tool.mutmut]` in
pyproject.toml names the modules and the tests). mutmut plants one small bug at a time (a flipped
operator, a changed constant, a dropped argument, ...) and runs the tests that call the mutated
function; a mutant that no test notices "survived". The JSON holds, per module, how many mutants
were killed, survived, timed out or had no test calling their function, and every survivor with
its diff and, where one is written in benchmarks/mutation/mutation_notes.json, why it is equivalent (no
behaviour changes) rather than untested. A survivor that changes only the wording of a message (the
text of string literals that hold a space or are pieces of a longer message, nothing else) is
counted apart as `text_only`: `score` counts it as a survivor, `score_behaviour` leaves it out.

    python benchmarks/mutation/mutation.py --out benchmarks/mutation/mutation.json          # ~40 minutes on 2 cores
    python benchmarks/mutation/mutation.py --out /tmp/m.json "rlpost.algos.*"       # only some mutants
"""

from __future__ import annotations

import argparse
import ast
import io
import json
import os
import platform
import shutil
import subprocess
import sys
import time
import tokenize
from collections import Counter, defaultdict
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO / "benchmarks"))
from provenance import commit  # noqa: E402

NOTES = Path(__file__).resolve().parent / "mutation_notes.json"
STATUS = {
    1: "killed",
    3: "killed",
    0: "survived",
    5: "no_tests",
    33: "no_tests",
    36: "timeout",
    24: "timeout",
    -24: "timeout",
    152: "timeout",
    255: "timeout",
    None: "not_checked",
}


# mutmut with the import hook of an editable install (`pip install -e .`) taken out: that hook
# would hand the tests the repository's rlpost instead of mutants/rlpost, and every mutant would
# look untested
MUTMUT = """
import sys
sys.meta_path[:] = [f for f in sys.meta_path if not getattr(f, "__module__", "").startswith("__editable__")]
sys.argv[0] = "mutmut"
from mutmut.__main__ import cli
cli()
"""


def cpu_model() -> str:
    """The CPU's model name (/proc/cpuinfo), else what platform knows."""
    cpuinfo = Path("/proc/cpuinfo")
    if cpuinfo.is_file():
        for line in cpuinfo.read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    return platform.processor() or platform.machine()


def results() -> dict[str, int | None]:
    """{mutant name: exit code} from mutmut's per-file results."""
    out = {}
    for meta in (REPO / "mutants").rglob("*.meta"):
        out.update(json.loads(meta.read_text()).get("exit_code_by_key", {}))
    return out


def module_of(mutant: str) -> str:
    """`rlpost.algos.losses.x_aggregate__mutmut_3` -> `rlpost/algos/losses.py`."""
    return mutant.rsplit(".", 1)[0].replace(".", "/") + ".py"


def show(mutant: str) -> str:
    proc = subprocess.run([sys.executable, "-m", "mutmut", "show", mutant], capture_output=True, text=True, cwd=REPO)
    return proc.stdout.strip()


_LAYOUT = {tokenize.NL, tokenize.NEWLINE, tokenize.INDENT, tokenize.DEDENT, tokenize.COMMENT, tokenize.ENDMARKER}


def _tokens(lines: list[str]) -> list[tuple[int, str]]:
    """(type, text) of the code in `lines` (each without its indent; a fragment's unclosed bracket
    or string ends it with an error token)."""
    out = []
    try:
        for tok in tokenize.generate_tokens(io.StringIO("\n".join(line.strip() for line in lines) + "\n").readline):
            if tok.type not in _LAYOUT:
                out.append((tok.type, tok.string))
    except (tokenize.TokenError, SyntaxError):
        out.append((tokenize.ERRORTOKEN, ""))
    return out


def _wording(old: str, new: str, only_strings: bool) -> bool:
    """Two string literals that differ only in a message's text: of the same kind, an f-string's
    {expressions} unchanged, the old text holding whitespace or standing among string pieces only
    (a key or a name such as "val/accuracy" or "controller.pt" is behaviour, not wording)."""
    try:
        a, b = ast.parse(old, mode="eval").body, ast.parse(new, mode="eval").body
    except SyntaxError:
        return False
    if isinstance(a, ast.Constant) and isinstance(b, ast.Constant) and type(a.value) is type(b.value):
        return only_strings or any(ch.isspace() for ch in str(a.value))
    if isinstance(a, ast.JoinedStr) and isinstance(b, ast.JoinedStr):
        exprs = [[ast.dump(v) for v in s.values if not isinstance(v, ast.Constant)] for s in (a, b)]
        return exprs[0] == exprs[1]
    return False


def text_only(diff: str) -> bool:
    """Whether a mutant's diff (`mutmut show`) changes nothing but the wording of messages."""
    lines = [line for line in diff.splitlines() if not line.startswith(("---", "+++"))]
    old = _tokens([line[1:] for line in lines if line.startswith("-")])
    new = _tokens([line[1:] for line in lines if line.startswith("+")])
    changed = [(a, b) for a, b in zip(old, new) if a != b]
    only_strings = all(t == tokenize.STRING for t, _ in old)
    return (
        len(old) == len(new)
        and bool(changed)
        and all(a[0] == b[0] == tokenize.STRING and _wording(a[1], b[1], only_strings) for a, b in changed)
    )


def parse_args() -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", required=True)
    ap.add_argument("--max-children", type=int, default=os.cpu_count() or 2)
    ap.add_argument("--keep", action="store_true", help="keep mutants/ (mutmut's cache) from an earlier run")
    ap.add_argument(
        "--report-only",
        action="store_true",
        help="no run: the report of what mutants/ holds (e.g. of a run stopped early; unchecked mutants counted)",
    )
    ap.add_argument("names", nargs="*", help="mutant name patterns to run (default: all)")
    return ap.parse_args()


def record_commit(commit_file: Path) -> None:
    """The code the mutants are made from: HEAD, "+changes" where rlpost/ or tests/ differ from it."""
    git = ["git", "-C", str(REPO)]
    head = subprocess.run([*git, "rev-parse", "--short", "HEAD"], capture_output=True, text=True).stdout.strip()
    dirty = subprocess.run([*git, "status", "--porcelain", "rlpost", "tests"], capture_output=True, text=True)
    commit_file.parent.mkdir(exist_ok=True)
    commit_file.write_text(head + ("+changes" if dirty.stdout.strip() else ""))


def run_mutmut(args) -> float:
    """mutmut's run (none with --report-only): its wall seconds."""
    start = time.time()
    env = {**os.environ, "TOKENIZERS_PARALLELISM": "false", "OMP_NUM_THREADS": "1", "RLPOST_MUTATION": "1"}
    cmd = [sys.executable, "-c", MUTMUT, "run", "--max-children", str(args.max_children), *args.names]
    proc = subprocess.run(["true"] if args.report_only else cmd, cwd=REPO, env=env, capture_output=True, text=True)
    wall = time.time() - start
    if proc.returncode != 0:
        print(proc.stdout[-3000:], proc.stderr[-3000:], file=sys.stderr)
        raise SystemExit(f"mutmut run failed (exit code {proc.returncode})")
    return wall


def scores(counts: Counter) -> dict:
    """The counts of one module, its score (text-only survivors counted as survivors) and its score
    on behaviour (text-only survivors left out)."""
    caught = counts["killed"] + counts["timeout"]
    behaviour = caught + counts["survived"] + counts["no_tests"]
    tested = behaviour + counts["text_only"]
    keys = ("killed", "survived", "text_only", "timeout", "equivalent", "no_tests", "not_checked")
    return {
        **{k: counts[k] for k in keys},
        "score": round(caught / tested, 4) if tested else None,
        "score_behaviour": round(caught / behaviour, 4) if behaviour else None,
    }


def tally() -> tuple[dict, list[dict]]:
    """Per module the count of each status and its scores; every survivor (and equivalent,
    text-only, untested or suspicious mutant) with its note and diff."""
    notes = json.loads(NOTES.read_text()) if NOTES.is_file() else {}
    by_module: dict[str, Counter] = defaultdict(Counter)
    survivors = []
    for mutant, code in sorted(results().items()):
        status = STATUS.get(code, "suspicious")
        module = module_of(mutant)
        diff = show(mutant) if status in ("survived", "suspicious") else ""
        if status == "survived" and mutant in notes:
            status = "equivalent"
        elif status == "survived" and text_only(diff):
            status = "text_only"
        by_module[module][status] += 1
        if status in ("survived", "text_only", "equivalent", "no_tests", "suspicious"):
            survivors.append({"mutant": mutant, "module": module, "status": status, "note": notes.get(mutant, ""),
                              "diff": diff})  # fmt: skip
    return {module: scores(counts) for module, counts in sorted(by_module.items())}, survivors


def commit_time(measured: str) -> str | None:
    """The measured commit's time (ISO 8601), from its hash ("1eae119", "ac0eea0+changes"), or None."""
    sha = measured.split("+")[0].split(":")[0].strip()
    out = subprocess.run(["git", "-C", str(REPO), "show", "-s", "--format=%cI", sha], capture_output=True, text=True)
    return out.stdout.strip() or None if out.returncode == 0 else None


def report(args, commit_file: Path, wall_file: Path, modules: dict, survivors: list[dict]) -> dict:
    """The JSON; its commit is that of the code the mutants were made from (this tree's, where
    mutants/ does not say)."""
    return {
        "command": "python benchmarks/mutation/mutation.py --out " + args.out + "".join(f" {n}" for n in args.names),
        "tool": "mutmut "
        + subprocess.run([sys.executable, "-m", "mutmut", "--version"], capture_output=True, text=True).stdout.strip(),
        "commit": (measured := commit_file.read_text() if commit_file.is_file() else commit()),
        "commit_time": commit_time(measured),  # (latest.py orders runs of one day by it)
        "machine": {"cpu": cpu_model(), "cores": os.cpu_count()},
        "date": time.strftime("%Y-%m-%d", time.gmtime(commit_file.stat().st_mtime if commit_file.is_file() else None)),
        "wall_s": int(wall_file.read_text()) if wall_file.is_file() else None,
        "score_note": "score = (killed + timeout) / (killed + survived + text_only + timeout + no_tests); "
        "score_behaviour leaves text_only out (survivors that change only a message's wording); "
        "equivalent survivors (benchmarks/mutation/mutation_notes.json) are left out of both, listed with their note",
        "modules": modules,
        "survivors": survivors,
    }


def main() -> None:
    args = parse_args()
    if not args.keep and not args.report_only:
        shutil.rmtree(REPO / "mutants", ignore_errors=True)
    commit_file = REPO / "mutants" / "rlpost-commit.txt"  # the code the mutants were made from
    if not args.report_only:
        record_commit(commit_file)
    wall = run_mutmut(args)
    wall_file = REPO / "mutants" / "rlpost-wall-s.txt"  # the run's time, for a later --report-only
    if not args.report_only:
        wall_file.write_text(str(round(wall)))
    modules, survivors = tally()
    out = report(args, commit_file, wall_file, modules, survivors)
    Path(args.out).write_text(json.dumps(out, indent=1) + "\n")
    for module, m in modules.items():
        print(f"{module:40s} {m}")
    print(f"{wall / 60:.1f} min")


if __name__ == "__main__":
    main()
