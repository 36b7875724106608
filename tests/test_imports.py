"""Rules of the import graph: test modules share code through tests/helpers.py only."""

import ast
from pathlib import Path

TESTS = Path(__file__).resolve().parent


def imported_modules(path: Path) -> set[str]:
    tree = ast.parse(path.read_text())
    names = set()
    for node in ast.walk(tree):  # function-level imports count too
        if isinstance(node, ast.ImportFrom) and node.module:
            names.add(node.module)
        elif isinstance(node, ast.Import):
            names.update(a.name for a in node.names)
    return names


def test_no_test_module_imports_another_test_module():
    offenders = {
        str(p.relative_to(TESTS)): sorted(
            m for m in imported_modules(p) if m.startswith("tests.") and m.rsplit(".", 1)[-1].startswith("test_")
        )
        for p in TESTS.rglob("test_*.py")
    }
    assert not {k: v for k, v in offenders.items() if v}


# Who may import whom inside rlpost (shared/DESIGN.md; docs/architecture.md): the pure packages stand
# alone (data only for the Batch type), trainer and rollout never import each other (what passes
# between them goes through weightsync; what both need of a model is in models), and only the
# controller knows about Ray.
MAY_IMPORT = {
    "algos": {"data"},
    "data": set(),
    "rewards": {"data"},
    "metrics": {"data"},
    "weightsync": {"data"},
    "models": set(),  # loading: what a model is made of; the roles that run one are in roles
    # the tiny-model world: building, warming up and measuring the models rlpost makes itself (the
    # multiply task's calculator episodes are measured through the hf rollout engine)
    "tiny": {"algos", "data", "rewards", "metrics", "envs", "models", "rollout"},  # algos: the lr shape
    "envs": {"data", "rewards"},  # data.userfile: an environment from a user's file; rewards.executor: tool calls
    "config": {"algos", "data", "envs", "metrics"},  # allowed choices come from the registries (data: tasks)
    "rollout": {"config", "data", "envs", "models", "weightsync"},
    "trainer": {"algos", "config", "data", "models"},  # the FSDP2 engine and log-probs (algos: the entropy)
    "roles": {"algos", "config", "data", "models", "rewards", "trainer", "weightsync"},
    "controller": {
        "algos",
        "config",
        "data",
        "envs",
        "limits",  # rlpost/limits.py (stdlib only): the process limits, checked again before a local Ray
        "metrics",
        "models",
        "rewards",
        "roles",
        "rollout",
        "tiny",
        "trainer",
        "weightsync",
    },
}
RLPOST = TESTS.parent / "rlpost"
SHARED = {"registry"}  # rlpost/registry.py: the one registry type, stdlib only; every package may use it


def package_imports(package: str) -> dict[str, set[str]]:
    """{module file: the rlpost packages and third-party roots it imports} for one package."""
    out = {}
    for path in (RLPOST / package).rglob("*.py"):
        out[str(path.relative_to(RLPOST))] = imported_modules(path)
    return out


def test_each_package_imports_only_what_the_design_allows():
    assert set(MAY_IMPORT) == {p.name for p in RLPOST.iterdir() if (p / "__init__.py").is_file()}
    wrong = []
    for package, allowed in MAY_IMPORT.items():
        for module, names in package_imports(package).items():
            used = {n.split(".")[1] for n in names if n.startswith("rlpost.") and n.count(".") >= 1}
            wrong += [f"{module} imports rlpost.{u}" for u in sorted(used - allowed - {package} - SHARED)]
            if package != "controller" and any(n == "ray" or n.startswith("ray.") for n in names):
                wrong.append(f"{module} imports ray: only the controller knows about Ray")
    assert not wrong, "\n".join(wrong)


def test_the_controller_imports_neither_peft_nor_vllm():
    """The controller imports the roles' modules to start their actors; peft (seconds to import) and
    vLLM (tens of seconds on a GPU machine) are imported where they are used: a run with LoRA, the
    rollout actor. Checked in a fresh interpreter, as `rlpost train` starts."""
    import subprocess
    import sys

    code = "import sys, rlpost.cli, rlpost.controller.loop; print(sorted({'peft', 'vllm'} & set(sys.modules)))"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"
