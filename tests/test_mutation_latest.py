"""benchmarks/mutation/LATEST.md (README's mutation row links it) is what latest.py makes of the committed
runs: a new run, or a run's JSON changed, without the table written again fails here. And the rule it
rests on: a module's newest run is the one that measured the newest commit, whatever the file's name."""

from __future__ import annotations

import json

from tests.helpers import load_benchmark


def test_the_table_is_the_committed_runs_newest_of_each_module():
    latest = load_benchmark("benchmarks/mutation/latest.py")
    written = (latest.HERE / "LATEST.md").read_text()
    assert written == latest.table(latest.newest(latest.runs())), "run: python benchmarks/mutation/latest.py"


def test_a_modules_newest_run_is_the_newest_commit_measured_and_a_run_without_its_mutants_says_nothing(tmp_path):
    latest = load_benchmark("benchmarks/mutation/latest.py")
    counts = {"killed": 9, "survived": 1, "score": 0.9}
    none = {"killed": 0, "survived": 0, "score": None}
    runs = {
        "mutation_b.json": ("2026-11-27T10:00:00+00:00", {"a.py": counts, "b.py": counts}),
        "mutation_a.json": ("2026-11-28T10:00:00+00:00", {"a.py": {**counts, "score": 1.0}, "b.py": none}),
    }
    for name, (when, modules) in runs.items():
        (tmp_path / name).write_text(json.dumps({"commit": "abc", "commit_time": when, "modules": modules}))
    (tmp_path / "mutation_notes.json").write_text('{"x": "a note"}')  # not a run
    newest = latest.newest(latest.runs(tmp_path))
    assert {m: (name, c["score"]) for m, (name, _, c) in newest.items()} == {
        "a.py": ("mutation_a.json", 1.0),
        "b.py": ("mutation_b.json", 0.9),
    }
