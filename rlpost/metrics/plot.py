"""`rlpost plot`: PNG curves of one run or several side by side, or of a benchmark's JSON.

Runs: six panels (reward, validation accuracy, KL, entropy, response length, step time by phase),
a line per run. A JSON file (those of `benchmarks/`): every curve in it (a list of `[step, value]`
pairs, or a list of numbers), one panel per name, a line per run or row it belongs to, coloured by
what the rows compare (`recipe`, `name`, ...); and every small table of numbers (a dict of rows
of up to 8 numbers, or one such row) as bars. The panel titles are written into the PNG's
`Description` so that a test, or a reader's script, can tell what the picture holds.

"""

from __future__ import annotations

import json
import math
import os
from pathlib import Path

from rlpost.metrics.summary import PHASES, read_metrics

RUN_PANELS = (
    ("reward (mean)", "reward/mean"),
    ("validation accuracy", "val/accuracy"),
    ("KL to the reference", "actor/kl"),
    ("entropy", "actor/entropy"),
    ("response length (tokens)", "response_length/mean"),
)
PHASE_PANEL = "step time by phase (s)"
ROW_LABELS = ("recipe", "name", "algo", "placement", "kind")  # what a row of a benchmark compares
SETTINGS = ("settings", "setting", "machine", "config")
MAX_PANELS = 12
MAX_COLUMNS = 8


def _pyplot():
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def _grid(plt, n: int, width: float = 4.6, height: float = 3.2):
    cols = min(3, n)
    rows = -(-n // cols)
    fig, axes = plt.subplots(rows, cols, figsize=(width * cols, height * rows), squeeze=False)
    for ax in axes.flat[n:]:
        ax.set_visible(False)
    return fig, list(axes.flat[:n])


def _target(out, default: Path) -> Path:
    """Where a picture goes: `out`, or `default` (given a folder, `default`'s name in it); a name
    without an extension gets `.png`, as the picture is saved (the path said was the one given:
    the tenth catalogue's t51)."""
    if out is None:
        return default
    if str(out).endswith(("/", os.sep)) or Path(out).is_dir():
        return Path(out) / default.name
    return Path(out) if Path(out).suffix else Path(out).with_suffix(".png")


DRAWN = {"png": b"Title\x00rlpost", "svg": b"<title>rlpost</title>"}  # what marks a picture rlpost drew


def _save(fig, plt, out: Path, titles: list[str]) -> None:
    """`out` written as its name's format (PNG or SVG), unless it is a file rlpost did not draw (its
    Title is not `rlpost`)."""
    fmt = out.suffix[1:].lower()
    if fmt not in DRAWN:  # (PNG bytes went under any name: the twelfth catalogue's t59)
        plt.close(fig)
        raise ValueError(f"--out {out}: pictures are drawn as .png or .svg; give a name ending in one of them")
    if out.exists() and DRAWN[fmt] not in out.read_bytes()[:4096]:
        plt.close(fig)
        raise ValueError(f"{out} exists and is not a picture rlpost drew: give another --out, or move it away")
    fig.tight_layout()
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = out.with_name(f".{out.name}.tmp-{os.getpid()}")
    try:  # drawn beside it, then renamed: a full disk leaves no empty picture (the eleventh catalogue's t79)
        fig.savefig(
            tmp, format=fmt, dpi=100, metadata={"Title": "rlpost", "Description": "panels: " + " | ".join(titles)}
        )
        tmp.replace(out)
    except OSError as e:
        tmp.unlink(missing_ok=True)
        raise OSError(e.errno, e.strerror, str(out)) from e
    finally:
        plt.close(fig)


def _names(dirs: list[Path]) -> list[str]:
    names = [d.name for d in dirs]
    if len(set(names)) < len(names):  # e.g. runs/a/seed0 and runs/b/seed0
        names = [f"{d.parent.name}/{d.name}" for d in dirs]
    return names


def plot_runs(run_dirs: list[str | Path], out: str | Path | None = None) -> tuple[Path, list[str]]:
    """Curves of the runs in `run_dirs`, a line per run; written to `out` (default: the first
    run's folder, `curves.png` for one run, `compare.png` for several). Returns the file and the
    panel titles."""
    plt = _pyplot()
    dirs = [Path(d) for d in run_dirs]
    seen: dict[Path, Path] = {}
    for d in dirs:  # (the fourteenth catalogue's t30: one run drawn twice as a comparison)
        try:
            real = d.resolve()
        except RuntimeError:  # a symbolic-link loop, in Python 3.11 (cat20's t120)
            raise ValueError(f"{d}: a symbolic link in a loop, not a run folder; give the run's folder") from None
        if real in seen:
            raise ValueError(f"{d} is given twice (as {seen[real]} before): give each run once")
        seen[real] = d
    runs = [read_metrics(d) for d in dirs]
    for d, rows in zip(dirs, runs):
        check_plottable(d / "metrics.jsonl", rows)
    names = _names(dirs)
    titles = [title for title, _ in RUN_PANELS] + [PHASE_PANEL]
    fig, axes = _grid(plt, len(titles))
    for ax, (title, key) in zip(axes, RUN_PANELS):
        odd = []  # steps whose value is NaN or infinite (the ninth catalogue's n60: drawn as "not logged")
        for i, (name, rows) in enumerate(zip(names, runs)):
            points = [(r["step"], r[key]) for r in rows if r.get(key) is not None]
            odd += [step for step, v in points if not math.isfinite(v)]
            if points:
                ax.plot(*zip(*points), color=f"C{i}", label=name, marker="o" if len(points) < 30 else None, ms=3)
        _not_finite(ax, odd)
        _dress(ax, title, "step", legend=len(runs) > 1, empty="not logged" if not odd else "")
    ax = axes[-1]
    phases = [p for p in PHASES if any(r.get(f"timing_s/{p}") for rows in runs for r in rows)]
    if len(runs) == 1:  # stacked over the steps
        rows = [r for r in runs[0] if "timing_s/step" in r]
        if rows and phases:
            ax.stackplot(
                [r["step"] for r in rows],
                [[r.get(f"timing_s/{p}", 0.0) for r in rows] for p in phases],
                labels=phases,
            )
    else:  # the mean per step of each phase, a bar per run
        width = 0.8 / len(runs)
        for i, (name, rows) in enumerate(zip(names, runs)):
            rows = [r for r in rows if "timing_s/step" in r] or [{}]
            means = [sum(r.get(f"timing_s/{p}", 0.0) for r in rows) / len(rows) for p in phases]
            ax.bar([j + i * width for j in range(len(phases))], means, width, color=f"C{i}", label=name)
        ax.set_xticks([j + 0.4 - width / 2 for j in range(len(phases))], phases, rotation=30, fontsize=8)
    _dress(ax, PHASE_PANEL, "step" if len(runs) == 1 else "", legend=bool(phases))
    out = _target(out, dirs[0] / ("curves.png" if len(dirs) == 1 else "compare.png"))
    _save(fig, plt, out, titles)
    return out, titles


def check_plottable(path: Path, rows: list[dict]) -> None:
    """Rows a run wrote (`read_metrics`: one a step): a trained step at least, and numbers (or null)
    where the panels read; else the file is named (a text value drew a text axis)."""
    if not any(r.get("step", 0) >= 1 for r in rows):
        raise ValueError(f"{path} has no trained step yet: nothing to plot for {path.parent}")
    keys = [key for _, key in RUN_PANELS] + [f"timing_s/{p}" for p in PHASES]
    for r in rows:
        odd = [k for k in keys if r.get(k) is not None and (type(r[k]) is bool or not isinstance(r[k], (int, float)))]
        if odd:
            raise ValueError(f"{path}: step {r.get('step')}'s {odd[0]} is {r[odd[0]]!r}, not a number: not plotted")


def _not_finite(ax, steps: list) -> None:
    """Say on the panel the steps whose value is NaN or infinite (no line can draw them)."""
    if steps:
        shown = ", ".join(map(str, sorted(set(steps))[:5])) + ("..." if len(set(steps)) > 5 else "")
        ax.text(0.02, 0.97, f"not finite at step {shown}", transform=ax.transAxes, va="top", color="C3", fontsize=7)


def _dress(ax, title: str, xlabel: str, legend: bool, empty: str = "not logged") -> None:
    ax.set_title(title, fontsize=10)
    if xlabel:
        ax.set_xlabel(xlabel, fontsize=8)
    ax.tick_params(labelsize=8)
    ax.grid(alpha=0.3)
    if not ax.has_data():
        ax.text(0.5, 0.5, empty, ha="center", va="center", transform=ax.transAxes, color="grey")
    elif legend:
        ax.legend(fontsize=7)


# ------------------------------------------------------------------------------ benchmark JSON
def _number(v) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool)


def _numbers(d: dict) -> dict:
    return {k: v for k, v in d.items() if _number(v) and k != "seed"}  # a seed names a row


def _row_label(item: dict, index: int) -> tuple[str, str]:
    """(label, group) of a list item: e.g. (`dapo seed 1`, `dapo`)."""
    group = " ".join(str(item[k]) for k in ROW_LABELS if isinstance(item.get(k), str))
    label = f"{group} seed {item['seed']}".strip() if "seed" in item else group
    return label or f"#{index}", group or label or f"#{index}"


def collect(data) -> tuple[dict[str, list], dict[str, dict]]:
    """The curves of a JSON document by name (each `(label, group, xs, ys)`: the row of a list it
    sits in, or else the path of the dict that holds it) and its tables by title (`{row: {column:
    number}}`; the items of a list are the rows of one table). Settings (`settings`, `machine`)
    and the document's top-level numbers are not results: left out."""
    curves: dict[str, list] = {}
    tables: dict[str, dict] = {}

    def walk(node, path: list[str], row: tuple[str, str] | None, in_table: bool) -> None:
        if isinstance(node, dict):
            if path and path[-1] in SETTINGS:
                return
            rows = {k: _numbers(v) for k, v in node.items() if isinstance(v, dict) and k not in SETTINGS}
            columns = list(dict.fromkeys(c for r in rows.values() for c in r))
            table = len(rows) >= 2 and all(rows.values()) and 2 <= len(columns) <= MAX_COLUMNS
            title = ".".join(path) or "results"
            if table:
                tables.setdefault(title, {}).update({f"{row[0]} {k}" if row else k: r for k, r in rows.items()})
            elif path and not in_table and 2 <= len(_numbers(node)) <= MAX_COLUMNS:
                tables.setdefault(title, {})[row[0] if row else ""] = _numbers(node)
            for k, v in node.items():
                walk(v, [*path, str(k)], row, table)
        elif isinstance(node, list) and node:
            name = path[-1] if path else "values"
            label, group = row or (".".join(path[:-1]),) * 2
            if len(node) >= 2 and all(isinstance(p, list) and len(p) == 2 and all(map(_number, p)) for p in node):
                curves.setdefault(name, []).append((label, group, [p[0] for p in node], [p[1] for p in node]))
            elif len(node) >= 3 and all(map(_number, node)) and not _index(node):
                curves.setdefault(name, []).append((label, group, list(range(len(node))), node))
            else:
                for i, item in enumerate(node):
                    if isinstance(item, dict):
                        walk(item, path, _row_label(item, i), False)

    walk(data, [], None, False)
    for name, lines in curves.items():  # paths as labels: what tells the lines apart
        short = _shorten([label for label, *_ in lines])
        group = _shorten([group for _, group, *_ in lines])
        curves[name] = [(s, g, xs, ys) for s, g, (_, _, xs, ys) in zip(short, group, lines)]
    return curves, tables


def _index(values: list) -> bool:
    """Step numbers or positions (increasing integers), not measurements."""
    return all(isinstance(v, int) for v in values) and all(a < b for a, b in zip(values, values[1:]))


def _shorten(labels: list[str]) -> list[str]:
    """Dotted paths without the components that they all share at the start and the end."""
    parts = [label.split(".") for label in labels]
    if len(parts) < 2:
        return [parts[0][-1]] if parts else []
    head = 0
    while all(len(p) > head + 1 and p[head] == parts[0][head] for p in parts):
        head += 1
    tail = 0
    while all(len(p) > head + tail + 1 and p[-1 - tail] == parts[0][-1 - tail] for p in parts):
        tail += 1
    return [".".join(p[head : len(p) - tail]) for p in parts]


def plot_json(path: str | Path, out: str | Path | None = None) -> tuple[Path, list[str]]:
    """The curves and tables of the JSON file `path` (see the module's text); written to `out`
    (default: next to it, `.png` for `.json`)."""
    path = Path(path)
    if (path.parent / "config.yaml").is_file() and (path.parent / "metrics.jsonl").is_file():  # (cat18's t19)
        raise ValueError(f"{path} is a file of the run {path.parent}: give its run folder, {path.parent}")
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except json.JSONDecodeError as e:
        raise ValueError(f"{path}: not JSON ({e})") from None
    except UnicodeDecodeError as e:  # (the fourteenth catalogue's t08: the codec's words alone)
        raise ValueError(f"{path}: not UTF-8 text ({e.reason} at byte {e.start}); save the file as UTF-8") from None
    except RecursionError:  # valid JSON nested deeper than Python's stack (t07: a raw traceback)
        raise ValueError(f"{path}: JSON nested too deep to read; not a benchmark JSON rlpost can plot") from None
    curves, tables = collect(data)
    panels = [("curve", name, lines) for name, lines in curves.items()]
    panels += [("table", title, rows) for title, rows in tables.items()]
    if not panels:
        raise ValueError(  # ([1, 2, 3] was refused as "no list of numbers": the eleventh catalogue's t69)
            f"{path}: no curve ([step, value] pairs, or a list of 3 or more numbers that are not just increasing "
            "integers, which read as steps) and no table of numbers"
        )
    if len(panels) > MAX_PANELS:
        print(f"rlpost plot: {path} holds {len(panels)} panels, the first {MAX_PANELS} are drawn")
        panels = panels[:MAX_PANELS]
    plt = _pyplot()
    fig, axes = _grid(plt, len(panels))
    titles = []
    for ax, (kind, title, content) in zip(axes, panels):
        titles.append(title)
        if kind == "curve":
            groups = list(dict.fromkeys(group for _, group, _, _ in content))
            seen = set()
            for label, group, xs, ys in content:
                color, marker = f"C{groups.index(group) % 10}", "o" if len(xs) < 30 else None  # (a lone point shows)
                name = None if group in seen else (group or None)
                ax.plot(xs, ys, color=color, alpha=0.85, label=name, marker=marker, ms=3)
                seen.add(group)
            _not_finite(ax, [x for _, _, xs, ys in content for x, y in zip(xs, ys) if not math.isfinite(y)])
            _dress(ax, title, "step", legend=len(groups) > 1 and len(groups) <= 12)
        else:
            _bars(ax, content)
            _dress(ax, title, "", legend=1 < len(content) <= 10)
    out = _target(out, path.with_suffix(".png"))
    _save(fig, plt, out, titles)
    return out, titles


def _bars(ax, rows: dict[str, dict]) -> None:
    """A group of bars per column, a bar per row (one row: a bar per column)."""
    columns = list(dict.fromkeys(c for r in rows.values() for c in r))
    width = 0.8 / len(rows)
    for i, (row, values) in enumerate(rows.items()):
        xs = [j + i * width for j, c in enumerate(columns) if c in values]
        ax.bar(xs, [values[c] for c in columns if c in values], width, color=f"C{i % 10}", label=row or None)
    ax.set_xticks([j + 0.4 - width / 2 for j in range(len(columns))], columns, rotation=30, ha="right", fontsize=7)
    positive = [v for r in rows.values() for v in r.values() if v > 0]
    if positive and max(positive) / min(positive) > 100:
        ax.set_yscale("log")
