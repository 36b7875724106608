"""Every result under benchmarks/ says what it measured (issue 40): the commit, the machine, the command
and the date, as top-level keys. A JSON written without them fails here, naming the file and the keys.
The drivers that write a CPU figure record `machine` as {"cpu": ..., "cores": ...}, so a mapping of
non-empty values counts as well as a string there. The drivers stamp their JSON through
benchmarks/provenance.py, tested at the end."""

import json
import os
import re
import subprocess
from pathlib import Path

import pytest

from tests.helpers import load_benchmark

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


# ---- the drivers write it: benchmarks/provenance.py
REPO = Path(__file__).resolve().parent.parent


def git(cwd: Path, *args: str) -> str:
    ident = ["-c", "user.name=t", "-c", "user.email=t@t", "-c", "commit.gpgsign=false"]
    return subprocess.run(["git", *ident, *args], cwd=cwd, capture_output=True, text=True, check=True).stdout.strip()


@pytest.mark.source  # reads this checkout's git HEAD (the mutation run's copy is no git checkout)
def test_the_four_keys_of_this_checkout():
    p = load_benchmark("benchmarks/provenance.py")
    found = p.provenance()
    assert list(found) == ["commit", "machine", "command", "date"]
    assert problems(found) == []  # what tests/test_provenance.py asks of a committed result
    head = git(REPO, "rev-parse", "--short", "HEAD")
    assert found["commit"] in (head, head + "+dirty")
    assert found["command"].startswith("python3 ")
    assert re.fullmatch(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\dZ", found["date"])
    assert p.provenance("python benchmarks/x.py --out a.json")["command"] == "python benchmarks/x.py --out a.json"


@pytest.mark.source  # reads this checkout's git HEAD
def test_git_wins_over_the_commit_variable_where_there_is_git(monkeypatch):
    p = load_benchmark("benchmarks/provenance.py")
    monkeypatch.setenv("COMMIT", "0000000")
    assert p.commit(REPO).split("+")[0] == git(REPO, "rev-parse", "--short", "HEAD")


def test_without_git_the_commit_variable_else_unknown_and_why(tmp_path, monkeypatch):
    """A copy of the tree without .git (a GPU machine): COMMIT where the caller set it."""
    p = load_benchmark("benchmarks/provenance.py")
    monkeypatch.setenv("COMMIT", "1a2b3c4")
    assert p.commit(tmp_path) == "1a2b3c4"
    assert p.provenance(repo=tmp_path)["commit"] == "1a2b3c4"
    monkeypatch.delenv("COMMIT")
    assert re.fullmatch(r"unknown \(.*not a git repository.*; set COMMIT\)", p.commit(tmp_path))
    monkeypatch.setenv("PATH", str(tmp_path))  # no git binary at all
    assert p.commit(tmp_path).startswith("unknown (no git")


def test_dirty_means_tracked_changes_under_rlpost_or_the_scripts_folder(tmp_path):
    p = load_benchmark("benchmarks/provenance.py")
    for name in ("rlpost/a.py", "benchmarks/b.py", "docs/c.md"):
        (tmp_path / name).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / name).write_text("x\n")
    git(tmp_path, "init", "-q")
    git(tmp_path, "add", ".")
    git(tmp_path, "commit", "-qm", "start")
    head = git(tmp_path, "rev-parse", "--short", "HEAD")
    (tmp_path / "rlpost" / "new.py").write_text("untracked\n")
    (tmp_path / "docs" / "c.md").write_text("changed elsewhere\n")
    assert p.commit(tmp_path, ["benchmarks"]) == head
    (tmp_path / "benchmarks" / "b.py").write_text("changed\n")
    assert p.commit(tmp_path, ["benchmarks"]) == head + "+dirty"
    assert p.commit(tmp_path, []) == head
    (tmp_path / "rlpost" / "a.py").write_text("changed\n")
    assert p.commit(tmp_path, []) == head + "+dirty"


def test_machine_names_the_cores_and_the_gpus(monkeypatch):
    p = load_benchmark("benchmarks/provenance.py")
    cores = f"{os.cpu_count()} CPU cores ({p.cpu_model()})"
    monkeypatch.setattr(p, "gpus", lambda: "")
    assert p.machine() == cores
    monkeypatch.setattr(p, "gpus", lambda: "2 x NVIDIA H100 80GB HBM3")
    assert p.machine() == f"2 x NVIDIA H100 80GB HBM3, {cores}"
    assert p.cpu_model()


@pytest.mark.parametrize(
    "record",
    [
        {"command": "python benchmarks/x.py --out a.json", "x": 1},  # a driver's own command
        {"machine": {"cpu": "AMD EPYC", "cores": 2}, "commit": "abc1234+changes"},  # its own machine and commit
        {"commit": None, "x": 1},  # left None by the driver: filled
    ],
)
def test_a_drivers_own_values_stay(record, monkeypatch):
    monkeypatch.setenv("COMMIT", "0123abc")  # what is filled, also where this copy is no git checkout
    p = load_benchmark("benchmarks/provenance.py")
    out = p.with_provenance(record)
    assert list(out)[:4] == ["commit", "machine", "command", "date"]
    assert problems(out) == []
    assert {k: out[k] for k, v in record.items() if v is not None} == {k: v for k, v in record.items() if v is not None}
