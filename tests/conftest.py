import os

import pytest

os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
os.environ.setdefault("WANDB_SILENT", "true")

if os.environ.get("RLPOST_MUTATION"):
    # benchmarks/mutation/mutation.py: mutmut forks one process per mutant from a server that has imported the
    # tests; import what the trainer tests load lazily (transformers' Qwen2, FSDP2, peft, Hydra's
    # config store) there too, so that each mutant's process does not pay seconds for it again
    import peft  # noqa: F401
    import torch
    import torch.distributed.checkpoint  # noqa: F401
    import torch.distributed.fsdp  # noqa: F401
    from transformers.models.qwen2 import modeling_qwen2  # noqa: F401

    from rlpost.config import load_config

    load_config(["+recipe=quickstart"])
    x = torch.randn(4, 4, requires_grad=True)
    (x @ x).sum().backward()


@pytest.fixture(scope="session")
def built_models(tmp_path_factory):
    """A model cache shared by the session: the quickstart test leaves its built start model here
    and the tiny reward model's test starts from it (run alone, that test builds it itself: the
    build is deterministic, so the model is the same either way)."""
    return tmp_path_factory.mktemp("built-models")


def pytest_collection_modifyitems(config, items):
    """GPU tests skip cleanly on machines without CUDA."""
    import torch

    if torch.cuda.is_available():
        return
    skip = pytest.mark.skip(reason="needs a CUDA GPU")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)


def pytest_sessionstart(session):
    """`RLPOST_REQUIRE=vllm,gguf,...` (.ci/run sets it): these packages must import. The tests of an
    optional package skip where it is not installed; where CI installed it and it broke (vLLM's
    CPU build with the wrong torchvision), they would skip too, and CI stay green."""
    import subprocess
    import sys

    for name in filter(None, os.environ.get("RLPOST_REQUIRE", "").split(",")):
        # in a process of its own: an import here (vLLM's) would change this session's state for every test
        done = subprocess.run([sys.executable, "-c", f"import {name}"], capture_output=True, text=True)
        if done.returncode:
            last = (done.stderr.strip().splitlines() or ["(no message)"])[-1]
            raise pytest.UsageError(f"RLPOST_REQUIRE names {name}, which does not import: {last}")


@pytest.hookimpl(trylast=True)  # after every other plugin's
def pytest_unconfigure(config):
    """The GPU tests' pytest has not exited after its summary (benchmarks/gpu_tests.json "exit"),
    holding minutes of device time. With RLPOST_EXIT_REPORT set, name what is still alive then;
    with RLPOST_HARD_EXIT set (the GPU runs' job lines), end the process here, with pytest's exit
    status, once the summary and the JUnit file are written."""
    if os.environ.get("RLPOST_EXIT_REPORT"):
        exit_report()
    if os.environ.get("RLPOST_HARD_EXIT"):
        hard_exit(getattr(config, "rlpost_exit_status", 1))


@pytest.hookimpl(trylast=True)
def pytest_terminal_summary(terminalreporter, exitstatus, config):
    """On a878c57's GPU run the unconfigure hook above was never reached: the summary and the
    JUnit file were written at 19:27:42 and the job's timeout ended pytest 2.5 minutes later, with no
    exit report. So the report comes here too (the summary's last line follows this hook), and with
    RLPOST_HARD_EXIT a timer ends the process 30 s after it, wherever it waits."""
    if os.environ.get("RLPOST_EXIT_REPORT"):
        exit_report()
    if os.environ.get("RLPOST_HARD_EXIT"):
        import threading

        timer = threading.Timer(30.0, hard_exit, args=(int(exitstatus),))
        timer.daemon = True  # a process that ends by itself is not held
        timer.start()


def hard_exit(status: int) -> None:
    import sys

    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(status)


def exit_report():
    """Non-daemon threads and child processes still alive, printed."""
    import threading
    from pathlib import Path

    threads = [t.name for t in threading.enumerate() if t is not threading.main_thread() and not t.daemon]
    children = []
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            pid, rest = stat.read_text().split(" (", 1)
            name, fields = rest.rsplit(") ", 1)
        except (OSError, ValueError):
            continue
        if int(fields.split()[1]) == os.getpid():
            try:  # its command line: on 8fd6f33 a `python3` child was all the report could say
                argv = (stat.parent / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
            except OSError:
                argv = name
            children.append(f"{pid} {argv[:300]}")
    print(f"\nRLPOST_EXIT_REPORT non-daemon threads={threads} children={children}", flush=True)


def pytest_sessionfinish(session, exitstatus):
    session.config.rlpost_exit_status = int(exitstatus)
