#!/usr/bin/env python3
"""Each module's newest mutation score, from the committed runs (`mutation_*.json`), as one table:
`benchmarks/mutation/LATEST.md` (README links it; tests/test_mutation_latest.py holds it to the JSONs).

A module's newest run is the one whose measured commit is the newest (`commit_time`); a run that planted
no mutant in a module (it was not among the run's names) says nothing of it. The scores are the JSON's own:
`score` counts every mutant that is not equivalent, `score_behaviour` leaves out those that change only a
message's wording (older runs did not tell them apart: the same figure). "Not reached" are mutants in code no
fast test calls (Ray, CUDA), counted against the score.

    python benchmarks/mutation/latest.py            # rewrites LATEST.md
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import tomllib

HERE = Path(__file__).resolve().parent
REPO = HERE.parent.parent
COUNTS = ("killed", "survived", "text_only", "timeout", "no_tests", "equivalent")


def runs(folder: Path = HERE) -> list[tuple[str, dict]]:
    """(file name, JSON) of every module-level mutation run in `folder`, oldest measured commit first."""
    found = []
    for path in sorted(folder.glob("mutation*.json")):
        data = json.loads(path.read_text())
        if isinstance(data, dict) and "modules" in data:
            if not data.get("commit_time"):
                raise SystemExit(f"{path}: no commit_time (the measured commit's time; mutation.py writes it)")
            found.append((path.name, data))
    return sorted(found, key=lambda run: run[1]["commit_time"])


def planted(counts: dict) -> int:
    return sum(counts.get(k, 0) for k in COUNTS)


def newest(all_runs: list[tuple[str, dict]]) -> dict[str, tuple[str, dict, dict]]:
    """module -> (file, run, counts) of the newest run that planted mutants in it."""
    out = {}
    for name, run in all_runs:  # oldest first: a newer run replaces an older one
        for module, counts in run["modules"].items():
            if planted(counts):
                out[module] = (name, run, counts)
    return dict(sorted(out.items()))


def fmt(score) -> str:
    return "-" if score is None else f"{score:.3f}"


def table(latest: dict[str, tuple[str, dict, dict]]) -> str:
    lines = [
        "# Mutation scores, newest run of each module",
        "",
        "Written by `python benchmarks/mutation/latest.py` from the committed runs (each row's JSON has its "
        "command, machine and survivors); `benchmarks/README.md` tells each run. A module's code may have "
        "changed since the commit measured: the commit is in the row.",
        "",
        "| module | score | leaving wording out | killed | survived | wording only | not reached | equivalent "
        "| measured on | JSON |",
        "| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |",
    ]
    for module, (name, run, c) in latest.items():
        behaviour = c.get("score_behaviour", c.get("score"))
        commit = run["commit"].split(":")[0]
        gone = "" if (REPO / module).is_file() else " (since moved or removed)"
        killed = c.get("killed", 0) + c.get("timeout", 0)
        lines.append(
            f"| `{module}`{gone} | {fmt(c.get('score'))} | {fmt(behaviour)} | {killed} "
            f"| {c.get('survived', 0)} | {c.get('text_only', 0)} | {c.get('no_tests', 0)} | {c.get('equivalent', 0)} "
            f"| {commit} ({run['commit_time'][:10]}) | [`{name}`]({name}) |"
        )
    unmeasured = [m for m in mutated_modules() if m not in latest]
    if unmeasured:
        lines += [
            "",
            "In `[tool.mutmut]`'s `only_mutate` but in no run yet: " + ", ".join(f"`{m}`" for m in unmeasured),
        ]
    return "\n".join(lines) + "\n"


def mutated_modules() -> list[str]:
    """The files pyproject.toml's `[tool.mutmut] only_mutate` names (its globs expanded), as they are now."""
    patterns = tomllib.loads((REPO / "pyproject.toml").read_text())["tool"]["mutmut"]["only_mutate"]
    files = {p for pattern in patterns for p in REPO.glob(pattern) if p.suffix == ".py" and p.name != "__init__.py"}
    return sorted(p.relative_to(REPO).as_posix() for p in files)  # (not mutmut's .meta and .spans beside them)


def main() -> None:
    text = table(newest(runs()))
    (HERE / "LATEST.md").write_text(text)
    sys.stdout.write(text)


if __name__ == "__main__":
    main()
