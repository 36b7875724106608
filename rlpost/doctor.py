"""`rlpost doctor`: what is installed (rlpost's version first, with its commit in a git checkout),
and `rlpost --version`."""

from __future__ import annotations

import argparse
import importlib
import subprocess
import sys
from importlib.metadata import PackageNotFoundError
from importlib.metadata import version as installed_version
from pathlib import Path

PACKAGES = "torch transformers ray hydra omegaconf peft datasets vllm flash_attn wandb tensorboard"


def version() -> str:
    """`rlpost 0.1.0`, and the commit where the package is a git checkout (an editable install):
    what a bug report needs first."""
    try:
        number = installed_version("rlpost")
    except PackageNotFoundError:  # run from a checkout that pip never installed
        number = "(not installed)"
    here = Path(__file__).resolve().parent.parent
    if not (here / ".git").exists():  # an installed wheel: no commit to name
        return f"rlpost {number}"
    try:
        out = subprocess.run(
            ["git", "-C", str(here), "describe", "--always", "--dirty"], capture_output=True, text=True, timeout=5
        )
    except (OSError, subprocess.SubprocessError):  # no git, or it hung
        return f"rlpost {number}"
    return f"rlpost {number}" + (f", commit {out.stdout.strip()}" if out.returncode == 0 else "")


def doctor(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="rlpost doctor")
    parser.add_argument("--config-docs", action="store_true", help="print docs/configuration.md")
    args = parser.parse_args(argv)
    if args.config_docs:
        from rlpost.config import config_docs

        sys.stdout.write(config_docs())
        return 0
    print(f"{'rlpost':14s} {version().removeprefix('rlpost ')}")
    for name in PACKAGES.split():
        try:
            module = importlib.import_module(name)
            print(f"{name:14s} {getattr(module, '__version__', '?')}")
        except ImportError:
            print(f"{name:14s} not installed")
        except Exception as e:  # noqa: BLE001  (installed, but its import fails: a build for another device, cat15's t52)
            print(f"{name:14s} cannot be imported ({type(e).__name__}: {(str(e).splitlines() or [''])[0][:200]})")
    import torch

    print(f"{'cuda':14s} {torch.cuda.device_count()} device(s)" if torch.cuda.is_available() else f"{'cuda':14s} none")
    return 0
