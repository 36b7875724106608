"""The GPU image's pins (Dockerfile + docker/requirements-gpu.txt) agree with pyproject.toml.

Every package the Dockerfile installs, and every dependency rlpost and its installed extras name,
must be pinned exactly (==) once in the constraints file; each pin must satisfy pyproject.toml's
specifier; a version written in the Dockerfile itself must equal the pin.
"""

import re
import shlex
import sys
from pathlib import Path

import pytest
from packaging.requirements import InvalidRequirement, Requirement
from packaging.utils import canonicalize_name
from packaging.version import Version

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover
    tomllib = pytest.importorskip("tomli")

REPO = Path(__file__).resolve().parents[1]
CONSTRAINTS = "docker/requirements-gpu.txt"
# the interpreter and platform of the image: markers in pyproject are judged for it
IMAGE_ENV = {
    "python_version": "3.12",
    "python_full_version": "3.12.3",
    "sys_platform": "linux",
    "platform_system": "Linux",
    "platform_machine": "x86_64",
    "os_name": "posix",
    "implementation_name": "cpython",
    "platform_python_implementation": "CPython",
}
OPTS_WITH_VALUE = {
    "-c",
    "--constraint",
    "-r",
    "--requirement",
    "-i",
    "--index-url",
    "--extra-index-url",
    "-f",
    "--find-links",
    "-e",
    "--editable",
    "-t",
    "--target",
    "--prefix",
    "--root",
}


def parse_pins(text: str) -> tuple[dict[str, list[Requirement]], list[str]]:
    """Requirement lines of a requirements/constraints file: {name: [requirements]}, problems."""
    pins, problems = {}, []
    for line in text.splitlines():
        line = line.split(" #")[0].strip()
        if not line or line.startswith("#"):
            continue
        try:
            req = Requirement(line)
        except InvalidRequirement as e:
            problems.append(f"{CONSTRAINTS}: cannot parse {line!r}: {e}")
            continue
        pins.setdefault(canonicalize_name(req.name), []).append(req)
    return pins, problems


def pip_installs(dockerfile: str) -> list[list[str]]:
    """The arguments of each `pip install` in the Dockerfile's RUN instructions."""
    text = re.sub(r"\\\n", " ", dockerfile)
    calls = []
    for line in text.splitlines():
        if not line.strip().upper().startswith("RUN"):
            continue
        for part in re.split(r"&&|;|\|\|", line):
            m = re.search(r"\bpip3?\s+install\s+(.*)$", part)
            if m:
                calls.append(shlex.split(m.group(1)))
    return calls


def dockerfile_requirements(dockerfile: str) -> tuple[list[Requirement], set[str], list[str]]:
    """What the Dockerfile's pip calls install: third-party requirements, extras of the local
    project (`-e ".[a,b]"` or `".[a,b]"`), problems."""
    reqs, extras, problems = [], set(), []
    for args in pip_installs(dockerfile):
        skip = False
        for i, arg in enumerate(args):
            if skip:
                skip = False
                if args[i - 1] in ("-e", "--editable"):
                    extras |= _local_extras(arg)
                continue
            if arg in OPTS_WITH_VALUE:
                skip = True
                continue
            if arg.startswith("-"):
                continue
            if arg.startswith(".") or arg.startswith("/"):
                extras |= _local_extras(arg)
                continue
            try:
                reqs.append(Requirement(arg))
            except InvalidRequirement as e:
                problems.append(f"Dockerfile: cannot parse pip argument {arg!r}: {e}")
    return reqs, extras, problems


def _local_extras(arg: str) -> set[str]:
    m = re.fullmatch(r"[./\w-]*\[([\w,\s-]+)\]", arg)
    return {e.strip() for e in m.group(1).split(",")} if m else set()


def check_pins(dockerfile: str, constraints: str, pyproject: dict) -> list[str]:
    """Every problem with the image's pins, in words (empty: all good)."""
    pins, problems = parse_pins(constraints)
    exact = {}
    for name, reqs in pins.items():
        if len(reqs) > 1:
            problems.append(f"{name} pinned {len(reqs)} times in {CONSTRAINTS}")
        for req in reqs:
            specs = list(req.specifier)
            if len(specs) != 1 or specs[0].operator not in ("==", "===") or "*" in specs[0].version:
                problems.append(f"{name}: pin {str(req.specifier)!r} is not exact (==)")
            else:
                exact.setdefault(name, Version(specs[0].version))

    project = pyproject["project"]
    optional = project.get("optional-dependencies", {})
    installed, extras, more = dockerfile_requirements(dockerfile)
    problems += more
    for extra in sorted(extras - set(optional)):
        problems.append(f"Dockerfile installs extra {extra!r}, which pyproject.toml does not define")

    # what pyproject says of each package: its dependencies and every extra
    declared = {}
    for line in project.get("dependencies", []) + [r for group in optional.values() for r in group]:
        req = Requirement(line)
        if req.marker is None or req.marker.evaluate(IMAGE_ENV):
            declared.setdefault(canonicalize_name(req.name), []).append(req)
    own = canonicalize_name(project["name"])

    # everything the image installs by name must be pinned: the Dockerfile's packages, rlpost's
    # dependencies and those of the extras it installs
    needed = {canonicalize_name(r.name) for r in installed}
    needed |= {canonicalize_name(Requirement(r).name) for r in project.get("dependencies", [])}
    for extra in extras & set(optional):
        needed |= {canonicalize_name(Requirement(r).name) for r in optional[extra]}
    for name in sorted(needed - {own} - set(pins)):
        problems.append(f"{name} is installed but not pinned in {CONSTRAINTS}")

    for name, version in sorted(exact.items()):
        for req in declared.get(name, []):
            if not req.specifier.contains(version, prereleases=True):
                problems.append(f"{name}=={version} does not satisfy pyproject.toml's {str(req)!r}")
    # a version written in the Dockerfile itself must be exact and equal the pin
    for req in installed:
        name = canonicalize_name(req.name)
        for spec in req.specifier:
            if spec.operator not in ("==", "==="):
                problems.append(f"Dockerfile: {req} is not an exact pin (==)")
            elif name in exact and Version(spec.version) != exact[name]:
                problems.append(f"Dockerfile pins {req}, {CONSTRAINTS} pins {name}=={exact[name]}")
    return problems


def read(path: str) -> str:
    return (REPO / path).read_text()


def test_image_pins_are_exact_and_agree_with_pyproject():
    pyproject = tomllib.loads(read("pyproject.toml"))
    assert check_pins(read("Dockerfile"), read(CONSTRAINTS), pyproject) == []


def test_image_installs_the_gpu_versions_and_every_pip_call_uses_the_pins():
    dockerfile = read("Dockerfile")
    pins, _ = parse_pins(read(CONSTRAINTS))
    versions = {name: str(reqs[0].specifier) for name, reqs in pins.items()}
    # the versions of the GPU machines (shared/tools/gpu-wheelhouse.sh, gpu-image-packages.txt)
    for name, version in [("torch", "2.11.0"), ("transformers", "5.17.0"), ("vllm", "0.26.0"), ("ray", "2.60.0")]:
        assert versions[name] == f"=={version}"
    calls = pip_installs(dockerfile)
    assert calls and all(CONSTRAINTS in args[args.index("-c") + 1] for args in calls if "-c" in args)
    assert all("-c" in args for args in calls), "a pip install without the constraints file"
    _, extras, _ = dockerfile_requirements(dockerfile)
    assert extras == {"vllm", "gpu", "wandb", "tasks", "gguf"}
    # the CUDA of the base image is the CUDA of torch's wheel index (cu130 <-> 13.0)
    image = re.search(r"^ARG CUDA_IMAGE=nvidia/cuda:(\d+)\.(\d+)\.\d+-\S*devel\S*$", dockerfile, re.M)
    index = re.search(r"^ARG TORCH_INDEX_URL=\S+/whl/cu(\d+)$", dockerfile, re.M)
    assert image and index and index.group(1) == image.group(1) + image.group(2)
    assert re.search(r"^ENV\b[^\n]*(\\\n[^\n]*)*\bNCCL_NVLS_ENABLE=0\b", dockerfile, re.M)
    assert re.search(r'^ENTRYPOINT \["rlpost"\]$', dockerfile, re.M)


GOOD_DOCKERFILE = (
    "RUN pip install -c docker/requirements-gpu.txt torch vllm && \\\n"
    '    pip install -c docker/requirements-gpu.txt -e ".[vllm]"\n'
)
PYPROJECT = {
    "project": {
        "name": "rlpost",
        "dependencies": ["torch>=2.6,<2.14"],
        "optional-dependencies": {"vllm": ["vllm>=0.26"], "wandb": ["wandb>=0.18"]},
    }
}


def test_the_check_passes_a_small_good_image():
    assert check_pins(GOOD_DOCKERFILE, "torch==2.11.0\nvllm==0.26.0  # why\n", PYPROJECT) == []


@pytest.mark.parametrize(
    "dockerfile, constraints, expected",
    [
        (GOOD_DOCKERFILE, "torch==2.11.0\nvllm==0.25.0\n", "vllm==0.25.0 does not satisfy"),  # out of range
        (GOOD_DOCKERFILE, "torch==2.14.0\nvllm==0.26.0\n", "torch==2.14.0 does not satisfy"),
        (GOOD_DOCKERFILE, "torch>=2.11\nvllm==0.26.0\n", "is not exact"),  # not ==
        (GOOD_DOCKERFILE, "torch==2.11.*\nvllm==0.26.0\n", "is not exact"),
        (GOOD_DOCKERFILE, "torch==2.11.0\n", "vllm is installed but not pinned"),  # unpinned
        (
            GOOD_DOCKERFILE + "RUN pip install -c x wandb\n",
            "torch==2.11.0\nvllm==0.26.0\n",
            "wandb is installed but not pinned",
        ),
        (GOOD_DOCKERFILE, "torch==2.11.0\ntorch==2.10.0\nvllm==0.26.0\n", "pinned 2 times"),
        (
            GOOD_DOCKERFILE.replace("torch vllm", "torch==2.10.0 vllm"),
            "torch==2.11.0\nvllm==0.26.0\n",
            "Dockerfile pins torch==2.10.0",
        ),  # disagree
        (
            GOOD_DOCKERFILE.replace("torch vllm", "torch>=2.10 vllm"),
            "torch==2.11.0\nvllm==0.26.0\n",
            "not an exact pin",
        ),
        (GOOD_DOCKERFILE.replace("[vllm]", "[vllm,cuda]"), "torch==2.11.0\nvllm==0.26.0\n", "extra 'cuda'"),
    ],
)
def test_the_check_catches_a_bad_image(dockerfile, constraints, expected):
    problems = check_pins(dockerfile, constraints, PYPROJECT)
    assert any(expected in p for p in problems), problems
