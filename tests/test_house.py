"""The house's size goals, kept by a test so they cannot slip unseen: no Python file over 400
lines and no function or method over 60 (rlpost/, tests/, benchmarks/, scripts/: a benchmark
driver's `main` names its phases too: parsing, building, measuring, writing), the step loop
(controller/loop.py) under 250 and no class in rlpost/ over 200. (Who may import whom:
tests/test_imports.py.)"""

import ast
from pathlib import Path

import pytest

pytestmark = pytest.mark.source  # the mutation run mutates (and so grows) the files these read

REPO = Path(__file__).resolve().parent.parent
RLPOST = REPO / "rlpost"
SIZED = [REPO / d for d in ("rlpost", "tests", "benchmarks", "scripts")]
SHORT_FUNCTIONS = SIZED


def python_files(roots):
    return [p for root in roots for p in sorted(root.rglob("*.py"))]


MAX_FILE_LINES, MAX_FUNCTION_LINES = 400, 60
LOOP, MAX_LOOP_LINES, MAX_CLASS_LINES = RLPOST / "controller" / "loop.py", 250, 200


def test_no_file_is_over_400_lines():
    long = {
        str(p.relative_to(REPO)): n
        for p in python_files(SIZED)
        if (n := len(p.read_text().splitlines())) > MAX_FILE_LINES
    }
    assert not long, f"files over {MAX_FILE_LINES} lines (split them by what they do): {long}"


def test_no_function_is_over_60_lines():
    long = {}
    for p in python_files(SHORT_FUNCTIONS):
        for node in ast.walk(ast.parse(p.read_text())):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                n = node.end_lineno - node.lineno + 1
                if n > MAX_FUNCTION_LINES:
                    long[f"{p.relative_to(REPO)}:{node.lineno} {node.name}"] = n
    assert not long, f"functions over {MAX_FUNCTION_LINES} lines (name their phases as functions): {long}"


def test_the_step_loop_stays_short():
    """A reader who opens the step sees the step: lifecycle, run loop and probes live elsewhere."""
    text = LOOP.read_text()
    assert len(text.splitlines()) < MAX_LOOP_LINES, f"{LOOP.name} has {len(text.splitlines())} lines"
    assert "class Controller" in text


def test_no_class_is_over_200_lines():
    """A class that grows past a screenful of jobs is split by job (the engine's adapter, the
    actor's weight export, the scorer of a batch each live apart)."""
    long = {
        f"{p.relative_to(REPO)}:{node.lineno} {node.name}": node.end_lineno - node.lineno + 1
        for p in python_files([RLPOST])
        for node in ast.walk(ast.parse(p.read_text()))
        if isinstance(node, ast.ClassDef) and node.end_lineno - node.lineno + 1 > MAX_CLASS_LINES
    }
    assert not long, f"classes over {MAX_CLASS_LINES} lines (split them by job): {long}"
