"""Every result under benchmarks/ says what it measured (issue 40): the commit, the machine, the command
and the date, as top-level keys. A JSON written without them fails here, naming the file and the keys.
The drivers that write a CPU figure record `machine` as {"cpu": ..., "cores": ...}, so a mapping of
non-empty values counts as well as a string there."""

import json
import re
from pathlib import Path

BENCHMARKS = Path(__file__).resolve().parent.parent / "benchmarks"
KEYS = ("commit", "machine", "command", "date")
COMMIT = re.compile(r"[0-9a-f]{7,40}(?![0-9a-f])")
DATE = re.compile(r"\d{4}-(0[1-9]|1[0-2])-(0[1-9]|[12]\d|3[01])(?!\d)")
# Not results of a run, so not held to the rule: each with the reason.
NOT_RESULTS = {
    "mutation/mutation_notes.json": "hand-written notes on equivalent mutants, read by mutation.py",
}


def results():
    found = sorted(p.relative_to(BENCHMARKS).as_posix() for p in BENCHMARKS.rglob("*.json"))
    return [name for name in found if name not in NOT_RESULTS]


def filled(key: str, value) -> bool:
    """A non-empty string; for `machine` also a mapping of non-empty values ({"cpu": ..., "cores": ...})."""
    if key == "machine" and isinstance(value, dict):
        return bool(value) and all(v not in (None, "", {}, []) for v in value.values())
    return isinstance(value, str) and bool(value.strip())


def problems(record) -> list[str]:
    """What `record` lacks: its missing or empty keys, then a commit or date of the wrong form."""
    if not isinstance(record, dict):
        return ["not a JSON object"]
    found = [k for k in KEYS if filled(k, record.get(k))]
    out = [f"missing or empty: {', '.join(k for k in KEYS if k not in found)}"] if len(found) < len(KEYS) else []
    if "commit" in found and not COMMIT.match(record["commit"]):
        out.append(f"commit does not start with 7-40 hex digits: {record['commit'][:60]!r}")
    if "date" in found and not DATE.match(record["date"]):
        out.append(f"date does not start with YYYY-MM-DD: {record['date'][:40]!r}")
    return out


def test_every_benchmark_json_records_its_provenance():
    names = results()
    assert len(names) >= 40, f"only {len(names)} result files found under {BENCHMARKS}"
    bad = {}
    for name in names:
        found = problems(json.loads((BENCHMARKS / name).read_text()))
        if found:
            bad[name] = found
    lines = [f"benchmarks/{name}: {'; '.join(p)}" for name, p in bad.items()]
    assert not bad, "results without their provenance (commit, machine, command, date):\n" + "\n".join(lines)


def test_the_files_left_out_still_exist():
    gone = [name for name in NOT_RESULTS if not (BENCHMARKS / name).is_file()]
    assert not gone, f"NOT_RESULTS names files that are gone: {gone}"


def test_the_check_names_what_is_missing():
    good = {"commit": "1a2b3c4", "machine": "1 x NVIDIA H100", "command": "python x.py", "date": "2026-11-27"}
    assert problems(good) == []
    assert problems(good | {"machine": {"cpu": "AMD EPYC", "cores": 2}}) == []
    assert problems({k: v for k, v in good.items() if k != "date"} | {"command": ""}) == [
        "missing or empty: command, date"
    ]
    assert problems(good | {"machine": {"cpu": "", "cores": 2}}) == ["missing or empty: machine"]
    assert len(problems(good | {"commit": "the commit that adds this file", "date": "Nov 27"})) == 2
    assert problems(good | {"commit": "1a2b3c4d+changes", "date": "2026-11-23T23:30:44Z/2026-11-24"}) == []
    assert problems(good | {"commit": "abc12", "date": "2026-13-01"}) == [
        "commit does not start with 7-40 hex digits: 'abc12'",
        "date does not start with YYYY-MM-DD: '2026-13-01'",
    ]
