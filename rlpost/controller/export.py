"""`rlpost export`: a run's checkpoint as a plain Hugging Face model folder (weights, config,
tokenizer), with LoRA the adapter merged into the base model. A failed or stopped export leaves no
folder it made, nor files in an empty one it was given."""

from __future__ import annotations

import shutil
import tempfile
from pathlib import Path

from rlpost.controller.checkpoint import run_config, select
from rlpost.controller.files import take_claim


def export(run_dir, out_dir, step: int | None = None, dtype: str | None = None, log=print) -> Path:
    """Write the policy of a run's checkpoint as a plain Hugging Face model folder (weights +
    config + tokenizer) that `AutoModelForCausalLM.from_pretrained` loads. With LoRA the
    checkpoint's `adapter/` is merged into the base model (`model.path` of the run, the tiny
    model resolved as the trainer does); without, the full weights come from the sharded
    checkpoint (`trainer/`). `dtype`: the run's `model.dtype` unless given. A failed export
    leaves no folder it made (nor files in an empty one it was given)."""
    run_dir, out_dir = Path(run_dir).expanduser(), Path(out_dir).expanduser()
    cfg = run_config(run_dir)
    folder = select(run_dir, step, log=log)
    check_base_model(cfg, run_dir)
    claim = out_dir / ".rlpost-export"  # two exports into one new --out both wrote it (the ninth catalogue's n62)
    if out_dir.is_symlink() and not out_dir.exists():  # (cat20's t117: read as another export's claim)
        raise FileExistsError(
            f"--out {out_dir}: a symbolic link that leads nowhere (in a loop, or to a folder "
            "that is gone); give another --out"
        )
    if out_dir.exists() and (not out_dir.is_dir() or any(p != claim for p in out_dir.iterdir())):
        raise FileExistsError(f"--out {out_dir} exists and is not an empty folder")
    made = not out_dir.exists()
    try:  # before the weights are loaded: a file where a folder of the path should be, no permission
        out_dir.mkdir(parents=True, exist_ok=True)
        take_claim(claim)
    except FileExistsError:
        raise FileExistsError(
            f"--out {out_dir}: another export is writing into it ({claim}); give another --out"
        ) from None
    except OSError as e:
        raise FileExistsError(f"--out {out_dir}: cannot make the folder ({e.strerror})") from None
    if [p.name for p in out_dir.iterdir()] != [claim.name]:  # another export finished into it meanwhile
        claim.unlink()
        raise FileExistsError(f"--out {out_dir} exists and is not an empty folder")
    try:
        write_export(cfg, folder, out_dir, dtype or cfg.model.dtype, log)
        claim.unlink()
    except BaseException:  # no half-written model left behind, nor the empty folder this made
        if made:
            shutil.rmtree(out_dir, ignore_errors=True)
        else:
            for path in out_dir.iterdir():
                if path.is_dir():
                    shutil.rmtree(path, ignore_errors=True)
                else:
                    path.unlink(missing_ok=True)
        if not folder.exists():  # a run training in the folder rotated it away (trainer.keep_checkpoints)
            raise FileNotFoundError(
                f"{folder} was deleted while it was exported: a run training in {run_dir} keeps only its newest "
                "checkpoints (trainer.keep_checkpoints); export a newer one, or after that run ends"
            ) from None
        raise
    log(f"exported {folder} to {out_dir}")
    return out_dir


def check_base_model(cfg, run_dir: Path) -> None:
    """The run's `model.path` must still be where the run found it: the export reads the base
    model's config and tokenizer (and with LoRA its weights) from there."""
    from rlpost.config.model_folder import missing_folder

    path = cfg.model.path
    problem = missing_folder("model.path", path)
    if problem is None:
        return
    yaml = run_dir / "config.yaml"
    if not Path(path).expanduser().exists():
        raise FileNotFoundError(
            f"model.path={path!r} (the run's, in {yaml}): no such folder any more; the export reads the base model's "
            f"config and tokenizer from it: move the model back there, or set model.path in {yaml} to its new place"
        )
    raise FileNotFoundError(f"{problem} (the run's model.path, in {yaml})")


def write_export(cfg, folder: Path, out_dir: Path, dtype: str, log=print) -> None:
    """The checkpoint `folder` of the run of `cfg`, as a Hugging Face model folder in `out_dir`."""
    from rlpost.models.lora import export_merged
    from rlpost.tiny.build import resolve_model_path, tiny_model_dir, untrained_tiny

    trust = cfg.model.trust_remote_code
    if cfg.model.path == "tiny" and cfg.model.lora.rank == 0 and not tiny_model_dir(cfg.model, cfg.data).is_dir():
        # (the seventeenth catalogue's t87: the cache was cleaned, and the export spent minutes on a warm-up)
        log("the run's tiny model is gone from model.cache_dir: its shape and tokenizer are made again without the "
            "warm-up (the checkpoint holds every weight)")  # fmt: skip
        with tempfile.TemporaryDirectory() as tmp:
            model, tokenizer = untrained_tiny(cfg.model, cfg.data)
            model.save_pretrained(tmp)
            tokenizer.save_pretrained(tmp)
            return write_full(folder, tmp, out_dir, dtype, trust, log)
    base = resolve_model_path(cfg.model, cfg.data, log=log, describe=False)  # (the base's start figure: cat18's t15a)
    if cfg.model.lora.rank > 0:
        from rlpost.controller.checkpoint import check_base
        from rlpost.models.fingerprint import weights_fingerprint

        check_base(folder, weights_fingerprint(base), base)  # (the adapter merged into another base: cat18's t17)
        adapter = folder / "adapter"
        if not (adapter / "adapter_model.safetensors").is_file():
            raise FileNotFoundError(
                f"{adapter / 'adapter_model.safetensors'} not found: a LoRA run's checkpoint keeps its adapter there"
            )
        log(f"merging {adapter} into {base}")
        export_merged(base, adapter, out_dir, dtype, trust)
    else:
        write_full(folder, base, out_dir, dtype, trust, log)


def write_full(folder: Path, base: str, out_dir: Path, dtype: str, trust: bool, log=print) -> None:
    """A full fine-tune's checkpoint `folder` loaded into the model of `base` (its shape and tokenizer)."""
    import logging

    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.api import CheckpointException

    from rlpost.models.loading import DTYPES, load_causal_lm, load_tokenizer
    from rlpost.trainer.checkpoint import not_dcp_loader

    sharded = folder / "trainer"
    if not (sharded / ".metadata").is_file():
        raise FileNotFoundError(f"{sharded / '.metadata'} not found: not a complete trainer checkpoint")
    log(f"loading {sharded} into {base}")
    model = load_causal_lm(base, "float32", trust_remote_code=trust)
    state = {"model": model.state_dict()}
    root = logging.getLogger()  # DCP logs its metadata fallbacks with tracebacks (the 18th catalogue's t41)
    root.addFilter(not_dcp_loader)
    try:
        dcp.load(state, checkpoint_id=str(sharded))  # in place, into the model's own tensors
    except (Exception, CheckpointException) as e:  # noqa: BLE001  (DCP's is a BaseException: a raw traceback)
        first = (str(e).strip().splitlines() or [""])[0][:200]
        raise ValueError(
            f"{sharded} could not be read ({type(e).__name__}: {first}); a file of it may be damaged or gone: "
            "export another step (--step)"
        ) from None
    finally:
        root.removeFilter(not_dcp_loader)
    model.to(DTYPES[dtype]).save_pretrained(out_dir)
    load_tokenizer(base, trust).save_pretrained(out_dir)
