"""A run's `config.yaml` read back (`checkpoint.run_config`): keys of another version of rlpost are
left out with a note, a key like one of the schema's (a slip of an edit) and a value that does not
fit are refused, named."""

from __future__ import annotations

import difflib
from pathlib import Path

_NOTED: set[Path] = set()  # config.yaml files whose keys of another version were said (once a process)
CLOSE = 0.85  # a key of config.yaml this near one of the schema's is a slip of an edit, refused; others are left out


def schema_key_like(key: str) -> str | None:
    """The schema's key that `key` is a slip of (within `CLOSE`), if any."""
    from rlpost.config.compose import ALL_KEYS

    return next(iter(difflib.get_close_matches(key, ALL_KEYS, n=1, cutoff=CLOSE)), None)


def read_config(path: Path, log=print):
    """The `TrainConfig` of the config.yaml at `path` (`run_config`'s)."""
    from omegaconf import OmegaConf
    from omegaconf.errors import OmegaConfBaseException
    from yaml import YAMLError

    from rlpost.config import ConfigError, TrainConfig

    try:
        saved = without_unknown_keys(OmegaConf.load(path), path, log)
        return OmegaConf.to_object(OmegaConf.merge(OmegaConf.structured(TrainConfig), saved))
    except (OmegaConfBaseException, YAMLError, UnicodeDecodeError) as e:  # edited by hand, or another version's
        key = getattr(e, "full_key", None)
        close = schema_key_like(str(key)) if key else None
        reason = str(e).strip().splitlines()[0] + (f" (did you mean {close}?)" if close else "")
        raise ConfigError(
            f"{path}: not a config rlpost can read{f' ({key})' if key else ''}: {reason}; it is the run's own record "
            "of its settings: undo the edit"
        ) from None


def without_unknown_keys(saved, path: Path, log=print):
    """`saved` (a loaded config.yaml) less the keys this rlpost's schema does not have, said once."""
    from omegaconf import DictConfig, OmegaConf

    from rlpost.config.compose import keys_not_in_schema

    unknown = keys_not_in_schema(saved) if isinstance(saved, DictConfig) else []
    unknown = [k for k in unknown if schema_key_like(k) is None]  # (one like a key of ours: a slip of an edit)
    for key in unknown:
        owner, _, leaf = key.rpartition(".")
        del (OmegaConf.select(saved, owner) if owner else saved)[leaf]
    if unknown and path not in _NOTED:
        _NOTED.add(path)
        log(
            f"note: {path} holds keys this rlpost does not have ({', '.join(unknown)}): written by another version "
            "of rlpost (or by hand); they are left out"
        )
    return saved
