"""`rlpost plot`: the PNG is written where it should be and holds the panels it should (their
titles are in the PNG's Description); runs side by side and benchmark JSON alike."""

import json
from pathlib import Path

import pytest
from PIL import Image

from rlpost.cli import main
from rlpost.metrics.plot import PHASE_PANEL, RUN_PANELS, collect, plot_json, plot_runs

REPO = Path(__file__).resolve().parents[2]
RUN_TITLES = [title for title, _ in RUN_PANELS] + [PHASE_PANEL]


def panels(png: Path) -> list[str]:
    description = Image.open(png).text["Description"]
    assert description.startswith("panels: ")
    return description[len("panels: ") :].split(" | ")


def fake_run(folder: Path, steps: int = 5, reward0: float = 0.2) -> Path:
    folder.mkdir(parents=True)
    rows = [{"step": 0, "val/accuracy": 0.5}]
    for s in range(1, steps + 1):
        rows.append(
            {
                "step": s,
                "reward/mean": reward0 + 0.1 * s,
                "actor/kl": 0.01 * s,
                "actor/entropy": 1.0 - 0.1 * s,
                "response_length/mean": 4.0,
                "timing_s/step": 1.0,
                "timing_s/gen": 0.4,
                "timing_s/update": 0.5,
                **({"val/accuracy": 0.5 + 0.05 * s} if s % 2 == 0 else {}),
            }
        )
    (folder / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    return folder


def test_one_run_gives_its_folder_a_png_of_six_panels(tmp_path):
    run = fake_run(tmp_path / "a")
    out, titles = plot_runs([run])
    assert out == run / "curves.png" and titles == RUN_TITLES and panels(out) == RUN_TITLES
    assert Image.open(out).size[0] > 1000


def test_several_runs_side_by_side_through_the_cli(tmp_path, capsys):
    a, b = fake_run(tmp_path / "x" / "seed0"), fake_run(tmp_path / "y" / "seed0", reward0=0.5)
    assert main(["plot", str(a), str(b)]) == 0
    assert panels(a / "compare.png") == RUN_TITLES
    assert capsys.readouterr().out.startswith(f"{a / 'compare.png'}: reward (mean), validation accuracy")
    assert main(["plot", str(a), str(b), "--out", str(tmp_path / "both.png")]) == 0
    assert (tmp_path / "both.png").is_file()


def test_json_curves_are_grouped_by_name_and_tables_become_bars(tmp_path):
    doc = {
        "machine": {"cpu": "x", "cores": 2, "threads": 4},  # settings: no panel
        "runs": [
            {"recipe": "grpo", "seed": 0, "val_accuracy": [[0, 0.5], [10, 0.7]], "gain": 0.2, "wall_s": 90.0},
            {"recipe": "grpo", "seed": 1, "val_accuracy": [[0, 0.5], [10, 0.8]], "gain": 0.3, "wall_s": 95.0},
            {"recipe": "ppo", "seed": 0, "val_accuracy": [[0, 0.5], [10, 0.9]], "gain": 0.4, "wall_s": 99.0},
        ],
        "results": {"fast": {"serial_ms": 1.0, "pool_ms": 2.0}, "slow": {"serial_ms": 300.0, "pool_ms": 150.0}},
        "per_step": {"colocate": {"step_s": [1.0, 0.9, 0.8]}, "split": {"step_s": [0.6, 0.5, 0.5]}},
        "summarized_steps": [2, 3, 4],  # step numbers, not a measurement
    }
    curves, tables = collect(doc)
    assert [(label, group) for label, group, _, _ in curves["val_accuracy"]] == [
        ("grpo seed 0", "grpo"),
        ("grpo seed 1", "grpo"),
        ("ppo seed 0", "ppo"),
    ]
    assert [label for label, *_ in curves["step_s"]] == ["colocate", "split"]
    assert curves["step_s"][1][2:] == ([0, 1, 2], [0.6, 0.5, 0.5])
    assert "summarized_steps" not in curves
    assert tables == {
        "runs": {
            "grpo seed 0": {"gain": 0.2, "wall_s": 90.0},
            "grpo seed 1": {"gain": 0.3, "wall_s": 95.0},
            "ppo seed 0": {"gain": 0.4, "wall_s": 99.0},
        },
        "results": {"fast": {"serial_ms": 1.0, "pool_ms": 2.0}, "slow": {"serial_ms": 300.0, "pool_ms": 150.0}},
    }
    path = tmp_path / "bench.json"
    path.write_text(json.dumps(doc))
    out, titles = plot_json(path)
    assert out == tmp_path / "bench.png" and panels(out) == titles == ["val_accuracy", "step_s", "runs", "results"]


@pytest.mark.parametrize("name", ["algorithms", "quickstart_seeds", "rewards_cpu", "grpo_h200", "trl_vs_rlpost"])
def test_the_benchmarks_json_are_pictures(tmp_path, name):
    out, titles = plot_json(REPO / "benchmarks" / f"{name}.json", tmp_path / f"{name}.png")
    assert panels(out) == titles and titles
    if name in ("algorithms", "quickstart_seeds"):
        assert titles[0] == "val_accuracy"


def test_bad_plot_arguments_are_named(tmp_path, capsys):
    run = fake_run(tmp_path / "a")
    (tmp_path / "notes.json").write_text(json.dumps({"note": "text only"}))
    assert main(["plot", str(tmp_path / "nowhere")]) == 2
    assert "no metrics.jsonl" in capsys.readouterr().err
    assert main(["plot", str(run), str(tmp_path / "notes.json")]) == 2
    assert "not both" in capsys.readouterr().err
    assert main(["plot", str(tmp_path / "notes.json")]) == 2
    assert "no curve" in capsys.readouterr().err


def test_a_file_rlpost_did_not_draw_is_not_replaced_and_a_folder_gets_the_picture_inside(tmp_path, capsys):
    """The ninth catalogue's n32 (a user's `compare.png` replaced without a word) and n68 (`--out`
    a folder: `FOLDER.png` written beside it, the folder's path printed)."""
    a, b = fake_run(tmp_path / "a"), fake_run(tmp_path / "b")
    (a / "compare.png").write_text("my notes")
    assert main(["plot", str(a), str(b)]) == 2
    assert "compare.png exists and is not a picture rlpost drew" in capsys.readouterr().err
    assert (a / "compare.png").read_text() == "my notes"
    (a / "compare.png").unlink()
    assert main(["plot", str(a), str(b)]) == 0 and main(["plot", str(a), str(b)]) == 0  # its own: drawn again
    (tmp_path / "pics").mkdir()
    for out in (tmp_path / "pics", f"{tmp_path / 'new'}/"):
        capsys.readouterr()
        assert main(["plot", str(a), str(b), "--out", str(out)]) == 0
        picture = Path(str(out).rstrip("/")) / "compare.png"
        assert capsys.readouterr().out.startswith(f"{picture}: ") and panels(picture)
    assert not (tmp_path / "pics.png").exists() and not (tmp_path / "new.png").exists()


def test_a_value_that_is_not_finite_is_said_on_its_panel_not_drawn_as_not_logged(tmp_path, monkeypatch):
    """The ninth catalogue's n60: a NaN reward (an environment's NaN turn reward) showed as "not logged"."""
    import matplotlib.axes

    said = []
    real = matplotlib.axes.Axes.text
    monkeypatch.setattr(matplotlib.axes.Axes, "text", lambda ax, *a, **k: said.append(a[2]) or real(ax, *a, **k))
    run = fake_run(tmp_path / "nan", steps=1)
    rows = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    rows[1]["reward/mean"] = float("nan")  # its only step
    (run / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    plot_runs([run])
    assert "not finite at step 1" in said
    assert said.count("not logged") == 0  # every panel of this run has its values (the reward's: NaN)


def test_a_full_disk_names_the_picture_and_leaves_no_part_of_it(tmp_path, monkeypatch):
    """The eleventh catalogue's t79: "cannot write None (No space left on device)" and an empty
    picture left where it was to go."""
    from matplotlib.figure import Figure

    run = fake_run(tmp_path / "a")

    def full(self, fname, **kw):
        Path(fname).write_bytes(b"\x89PNG half")
        raise OSError(28, "No space left on device")  # as a write to a full disk raises: no file name

    monkeypatch.setattr(Figure, "savefig", full)
    with pytest.raises(OSError, match="No space") as e:
        plot_runs([run], tmp_path / "out" / "full.png")
    assert e.value.filename == str(tmp_path / "out" / "full.png")
    assert list((tmp_path / "out").iterdir()) == []


def test_an_infinite_metric_is_written_as_it_is_and_said_where_it_is_drawn(tmp_path, monkeypatch, capsys):
    """The fourteenth catalogue's t06: a reward of inf went into metrics.jsonl as null and its panel
    read "not logged"; a benchmark JSON's Infinity, and the point before it, were left out unsaid."""
    import matplotlib.axes

    from rlpost.metrics.summary import read_metrics
    from rlpost.metrics.trackers import JsonlTracker

    run = tmp_path / "run"
    run.mkdir()
    tracker = JsonlTracker(run)
    tracker.log({"reward/mean": float("inf"), "actor/entropy": float("nan"), "timing_s/step": 1.0}, 1)
    tracker.close()
    row = read_metrics(run)[0]
    assert row["reward/mean"] == float("inf") and row["actor/entropy"] != row["actor/entropy"]  # (NaN)
    said = []
    real = matplotlib.axes.Axes.text
    monkeypatch.setattr(matplotlib.axes.Axes, "text", lambda ax, *a, **k: said.append(a[2]) or real(ax, *a, **k))
    plot_runs([run])
    assert said.count("not finite at step 1") == 2  # the reward's panel and the entropy's
    lines = []
    drawn = matplotlib.axes.Axes.plot
    monkeypatch.setattr(matplotlib.axes.Axes, "plot", lambda ax, *a, **k: lines.append((a, k)) or drawn(ax, *a, **k))
    path = tmp_path / "inf.json"
    path.write_text('{"loss": [1.5, Infinity, 2.0, 3.0, 2.5]}')
    said.clear()
    plot_json(path)
    assert said == ["not finite at step 1"] and lines[0][1]["marker"] == "o"  # 1.5 alone between gaps: a point


@pytest.mark.parametrize(
    "content, says",
    [
        ("[" * 100_000 + "]" * 100_000, "JSON nested too deep to read; not a benchmark JSON rlpost can plot"),
        (
            '{"d\xe9bit": [1.5, 2.0, 3.0]}'.encode("latin-1"),
            "not UTF-8 text (invalid continuation byte at byte 3); save the file as UTF-8",
        ),
    ],
    ids=["nested", "latin-1"],
)
def test_a_json_file_plot_cannot_read_is_named_with_what_is_wrong(tmp_path, capsys, content, says):
    """The fourteenth catalogue's t07 (RecursionError's traceback) and t08 (the codec's words alone)."""
    path = tmp_path / "x.json"
    path.write_bytes(content if isinstance(content, bytes) else content.encode())
    assert main(["plot", str(path)]) == 2
    assert capsys.readouterr().err.strip() == f"rlpost plot: {path}: {says}"


def test_a_run_given_twice_is_refused_under_either_spelling(tmp_path, capsys):
    """The fourteenth catalogue's t30: `rlpost plot runs/a runs/a` drew one run twice as a comparison."""
    run = fake_run(tmp_path / "a")
    again = tmp_path / "x" / ".." / "a"
    (tmp_path / "x").mkdir()
    assert main(["plot", str(run), str(again)]) == 2
    assert (
        capsys.readouterr().err.strip() == f"rlpost plot: {again} is given twice (as {run} before): give each run once"
    )
