"""Composing a config: configs/train.yaml + a recipe (`+recipe=NAME`) + command-line overrides,
through Hydra, into a validated `TrainConfig`; unknown keys and bad values fail before anything
starts, naming the closest keys or the allowed values. Also the config as YAML and the generated
reference (`docs/configuration.md`)."""

from __future__ import annotations

import dataclasses
import difflib
import re
import unicodedata
from pathlib import Path

from omegaconf import DictConfig, OmegaConf

from rlpost.config.rules import range_text, validate
from rlpost.config.schema import ConfigError, TrainConfig, iter_fields

ALL_KEYS = [k for k, _ in iter_fields()]
MAPPINGS = [
    k for k, f in iter_fields() if f.type in ("dict", dict)
]  # reward.kwargs, data.gym.config: keys of their own


def closest_keys(key: str, n: int = 3) -> list[str]:
    """Schema keys that look like `key` (by full path, then by last component)."""
    close = difflib.get_close_matches(key, ALL_KEYS, n=n, cutoff=0.85)
    leaf = key.rsplit(".", 1)[-1]
    by_leaf = [k for k in ALL_KEYS if difflib.get_close_matches(leaf, [k.rsplit(".", 1)[-1]], cutoff=0.75)]
    return list(dict.fromkeys(close + by_leaf + difflib.get_close_matches(key, ALL_KEYS, n=n, cutoff=0.6)))[:n]


REPO_ROOT = Path(__file__).resolve().parents[2]
CONFIG_DIR = REPO_ROOT / "configs"
RECIPE_DIR = REPO_ROOT / "recipes"
_KEY_IN_MESSAGE = re.compile(r"full_key: ([\w.\[\]]+)|Could not override '([\w.]+)'|Key '([\w.]+)'")


_registered: tuple = ()  # the recipe files (name, mtime) last registered in Hydra's config store


def _register_schema_and_recipes() -> None:
    """The schema and every recipe in Hydra's config store, again only when a recipe file changed:
    registering them was half of each `compose` (0.08 of 0.16 s on 2 cores)."""
    from hydra.core.config_store import ConfigStore

    global _registered
    recipes = sorted(RECIPE_DIR.glob("*.yaml"))
    stamp = tuple((p.name, p.stat().st_mtime_ns) for p in recipes)
    store = ConfigStore.instance()
    if stamp == _registered and "rlpost_schema.yaml" in store.repo:
        return
    store.store(name="rlpost_schema", node=TrainConfig)
    for path in recipes:
        store.store(group="recipe", name=path.stem, node=OmegaConf.load(path), package="_global_")
    _registered = stamp


def unknown_key(key: str) -> str:
    """One line for a key the config does not have: the closest keys, or how a recipe is chosen."""
    if key == "recipe":
        return "unknown config key 'recipe'; a recipe is chosen with +recipe=NAME (the + adds it)"
    if (parent := key.rpartition(".")[0]) in MAPPINGS:  # (the seventeenth catalogue's t133)
        return f"unknown config key '{key}': {parent} is a mapping, whose new keys are added with +: +{key}=VALUE"
    hint = closest_keys(key)
    return f"unknown config key '{key}'" + (f"; did you mean: {', '.join(hint)}?" if hint else "")


def _explain(error: Exception, overrides: list[str] = ()) -> str:
    """Turn a Hydra/OmegaConf composition error into one line naming the key and what would fix it."""
    text = str(error)
    bad = getattr(error, "override", None)  # Hydra's parser: the override was not named (cat11's t57)
    if isinstance(bad, str) and (slip := typing_slip(bad, list(overrides))):
        return slip
    if isinstance(bad, str) and "[" in bad.partition("=")[0]:  # a list item in the key (the fifteenth's t08)
        key = bad.partition("=")[0]
        return (
            f"{bad!r}: a list item is set as {key.replace('[', '.').replace(']', '')}=VALUE (its number after a dot), "
            f"or the whole list as {key.split('[')[0]}=[a,b]"
        )
    if isinstance(bad, str) and "extraneous input '='" not in text:  # (`==`: the command line names it)
        return (
            f"{bad!r} cannot be read as KEY=VALUE ({text.splitlines()[0].rstrip(':')}) (quote a value that holds "
            """characters such as ~ = , [ ] or spaces: "run.dir='~/runs/a'")"""
        )
    if error.__cause__ is not None:
        text += "\n" + str(error.__cause__)
    keys = [next(g for g in m.groups() if g) for m in _KEY_IN_MESSAGE.finditer(text)]
    key = max(keys, key=len) if keys else None
    first = text.strip().splitlines()[0]
    append = re.search(r"To append to your config use (\+[\w.]+=.*)", text)
    if append and append.group(1).split("=")[0].lstrip("+") in ALL_KEYS:  # a mapping key (reward.kwargs)
        return f"{first.rstrip('.')}: a mapping's new keys are added with +, as in {append.group(1)}"
    if key and key not in ALL_KEYS and ("not in" in text or "not in struct" in text or "Could not override" in text):
        return unknown_key(key)
    if "Multiple values for recipe" in text:
        return "one recipe a run: give +recipe=NAME once (its keys can be overridden one by one: KEY=VALUE)"
    missing = re.search(r"Could not find '(\w+)/", text)
    if missing and missing.group(1) == "recipe" and ".yaml" in text and "/" in text.split("recipe/", 1)[1]:
        return f"{first}: +recipe= takes the name of a recipe in {RECIPE_DIR}; copy your file there, then +recipe=NAME"
    if missing:
        group = missing.group(1)
        folder = RECIPE_DIR if group == "recipe" else CONFIG_DIR / group
        return f"{first}; options for {group}: {sorted(p.stem for p in folder.glob('*.yaml'))}"
    detail = [
        line
        for line in text.splitlines()[1:]
        if line.strip() and "full_key" not in line and "object_type" not in line and "Traceback" not in line
    ]
    return first + (f": {detail[0].strip()}" if detail else "") + (f" (key: {key})" if key and key not in first else "")


PASTED = {"\u2212": "-", "\u2013": "-", "\u2014": "-", "\u2010": "-", "\u2011": "-", "\u00a0": " ",
          "\u2018": "'", "\u2019": "'", "\u201c": '"', "\u201d": '"'}  # fmt: skip


def typing_slip(bad: str, overrides: list[str]) -> str | None:
    """What is wrong with an override Hydra cannot read, where it is a slip of typing: spaces around
    `=` (the shell made `KEY = VALUE` three words: the sixteenth catalogue's t43), or a character
    pasted from a paper or a word processor for the ASCII one (`1e−4` with U+2212: t44), a list's stray
    comma (`[a,]`: t104) or a quote left open (t142); else None."""
    i = overrides.index(bad) if bad in overrides else -1
    if i > 0 and overrides[i - 1].endswith("=") and "=" not in bad:  # `KEY= VALUE`: Hydra takes `KEY=` as a null
        i, bad = i - 1, overrides[i - 1]
    words = overrides[i : i + 3] if i >= 0 else [bad]
    if len(words) > 1 and ("=" not in bad and words[1].startswith("=") or bad.endswith("=") and "=" not in words[1]):
        joined = bad + words[1] + (words[2] if words[1] == "=" and len(words) > 2 else "")
        shown = " ".join(words[: 3 if words[1] == "=" else 2])
        return f"{shown!r}: write KEY=VALUE as one word, without spaces around '=': {joined}"
    key, _, value = bad.partition("=")
    if quote := next((q for q in "'\"" if value.count(q) % 2), None):  # (the sixteenth catalogue's t142)
        return f"{bad!r}: the quote {quote} opened in its value is not closed: {key}={value}{quote}"
    if re.search(r"\[\s*,|,\s*,|,\s*\]", value):  # a list's stray comma (the sixteenth catalogue's t104)
        fixed = re.sub(r",\s*\]", "]", re.sub(r"\[\s*,", "[", re.sub(r",\s*,", ",", value)))
        return f"{bad!r}: a list's items are separated by single commas, with none before ] or after [: {key}={fixed}"
    pasted = next((c for c in bad if c in PASTED), None)
    if pasted is None:
        return None
    fixed = "".join(PASTED.get(c, c) for c in bad)
    return (
        f"{bad!r}: {pasted!r} (U+{ord(pasted):04X} {unicodedata.name(pasted)}) is not the ASCII {PASTED[pasted]!r}, "
        f"as text copied from a paper or a word processor has it: type {fixed}"
    )


def check_forms(overrides: list[str]) -> None:
    """Overrides written in another tool's form, named before Hydra reads them (the seventeenth
    catalogue): a / for the dot (Hydra's config-group path: t13), KEY:VALUE (YAML's colon: t15), and
    Hydra's own `${hydra:...}` settings, which rlpost never sets (t19); the eighteenth's KEY+=VALUE and
    a pasted `# comment`."""
    for o in overrides:
        key, eq, value = o.lstrip("+~").partition("=")
        if o.startswith("~") and key not in ALL_KEYS and any(k.startswith(key + ".") for k in ALL_KEYS):
            raise ConfigError(  # (t131: every key of the section went back to its default, those given too)
                f"{o!r}: a whole section cannot be deleted (its keys, the recipe's and this command line's, would go "
                f"back to their defaults): give the keys of {key} the values you want (their defaults: "
                "docs/configuration.md)"
            )
        if eq and "/" in key and key.replace("/", ".") in ALL_KEYS:
            raise ConfigError(
                f"{o!r}: write {key.replace('/', '.')}={value} (rlpost's keys are joined with dots; a / picks a "
                "Hydra config group)"
            )
        colon = re.fullmatch(r"([\w.]+):(.*)", key) if not eq else None
        if colon and colon[1] in ALL_KEYS:
            raise ConfigError(f"{o!r}: write KEY=VALUE, not KEY:VALUE: {colon[1]}={colon[2].strip()}")
        if eq and key.endswith("+") and key[:-1] in ALL_KEYS:  # (the eighteenth catalogue's t85)
            raise ConfigError(f"{o!r}: rlpost has no +=: give the whole value, {key[:-1]}=[every item]")
        comment = re.search(r"\s+#.*$", value) if eq and key in ALL_KEYS and value[:1] not in "'\"" else None
        if comment:  # (a line pasted with its comment: t86)
            raise ConfigError(f"{o!r}: {comment[0].strip()!r} is a comment, which a command line does not take: "
                              f"{key}={value[: comment.start()]}")  # fmt: skip
        if "${hydra:" in value:
            raise ConfigError(
                f"{o!r}: ${{hydra:...}} reads Hydra's own run settings, which rlpost does not use; a sweep (-m) puts "
                "each job into a numbered folder under run.dir by itself: give run.dir a plain path"
            )


def keys_not_in_schema(node, prefix: str = "") -> list[str]:
    """Keys of a composed config that the schema does not have (`+key=` bypasses Hydra's check)."""
    out = []
    for k, v in node.items():
        key = f"{prefix}{k}"
        if key in ALL_KEYS:
            continue
        if isinstance(v, DictConfig) and any(a.startswith(key + ".") for a in ALL_KEYS):
            out += keys_not_in_schema(v, key + ".")
        else:
            out.append(key)
    return out


def leaves(node: dict, prefix: str = "") -> list[tuple[str, object]]:
    """`(dotted key, value)` of every leaf of a nested dict (an empty dict is a leaf)."""
    out = []
    for k, v in node.items():
        out += leaves(v, f"{prefix}{k}.") if isinstance(v, dict) and v else [(f"{prefix}{k}", v)]
    return out


def _as_override(value) -> str:
    """A value as a command-line override writes it (a list in brackets, no quotes)."""
    return f"[{','.join(map(str, value))}]" if isinstance(value, list) else str(value)


def _check_group_choices(composed: DictConfig, overrides: list[str]) -> None:
    """A group chosen on the command line (`data=reasoning_gym`, `model=hf`) whose keys a recipe
    sets back after it (a recipe's keys come after the groups): refused, with the keys to give, not
    trained on the recipe's task or model without a word (the eighth catalogue's e41)."""
    recipe = next((o.split("=", 1)[1] for o in overrides if o.startswith("+recipe=")), None)
    given = {o.split("=", 1)[0].lstrip("+") for o in overrides if "=" in o}
    for o in overrides:
        chosen = re.fullmatch(r"(data|model)=(\w+)", o)
        if recipe is None or chosen is None or not (CONFIG_DIR / chosen[1] / f"{chosen[2]}.yaml").is_file():
            continue
        group = OmegaConf.to_container(OmegaConf.load(CONFIG_DIR / chosen[1] / f"{chosen[2]}.yaml"), resolve=False)
        back = [
            (key, want, OmegaConf.select(composed, key))
            for key, want in leaves({k: v for k, v in group.items() if k != "defaults"}, f"{chosen[1]}.")
            if key not in given and OmegaConf.select(composed, key) != want
        ]
        if back:
            was = ", ".join(f"{k}={now!r}" for k, _, now in back)
            fix = " ".join(f"{k}={'...' if w == '???' else _as_override(w)}" for k, w, _ in back)
            raise ConfigError(
                f"{o} chose the {chosen[1]} group, but +recipe={recipe} sets {was} after it (a recipe's keys come "
                f"after the groups), so the run would not be the group's; give the group's keys on the command "
                f"line too: {fix}"
            )


def compose(overrides: list[str]) -> TrainConfig:
    """configs/train.yaml + recipe + overrides as a `TrainConfig`: known keys and types, not yet
    validated (`load_config` does both)."""
    from hydra import compose as hydra_compose
    from hydra import initialize_config_dir
    from hydra.core.global_hydra import GlobalHydra

    check_forms(list(overrides))
    _register_schema_and_recipes()
    GlobalHydra.instance().clear()
    try:
        with initialize_config_dir(config_dir=str(CONFIG_DIR), version_base="1.3"):
            composed: DictConfig = hydra_compose(config_name="train", overrides=list(overrides))
        unknown = keys_not_in_schema(composed)
        if unknown:
            raise ConfigError(unknown_key(unknown[0]))
        _check_group_choices(composed, list(overrides))
        return OmegaConf.to_object(composed)
    except ConfigError:
        raise
    except Exception as e:  # Hydra and OmegaConf raise several types; all mean a bad key/value
        raise ConfigError(_explain(e, overrides)) from e


def load_config(overrides: list[str], this_machine: bool = True) -> TrainConfig:
    """Compose configs/train.yaml + recipe + overrides into a validated `TrainConfig` (for this
    machine, or with `this_machine=False` for any: no check of its GPUs and packages)."""
    cfg = compose(overrides)
    validate(cfg, this_machine)
    return cfg


def to_yaml(cfg: TrainConfig) -> str:
    return OmegaConf.to_yaml(OmegaConf.structured(cfg))


def config_dict(cfg: TrainConfig) -> dict:
    return OmegaConf.to_container(OmegaConf.structured(cfg))


def config_docs() -> str:
    """Markdown reference of every key, generated from the schema."""
    lines = [
        "# Configuration reference",
        "",
        "Generated from `rlpost/config.py` by `rlpost doctor --config-docs`; do not edit by hand.",
        "Set any key on the command line: `rlpost train +recipe=quickstart trainer.total_steps=5`.",
        "",
    ]
    section_name = None
    for key, f in iter_fields():
        top = key.split(".")[0]
        if top != section_name:
            section_name = top
            lines += ["", f"## `{top}`", "", "| key | type | default | meaning |", "| --- | --- | --- | --- |"]
        default = f.default if f.default is not dataclasses.MISSING else f.default_factory()
        type_name = f.type if isinstance(f.type, str) else getattr(f.type, "__name__", str(f.type))
        help_text = f.metadata.get("help", "")
        if "range" in f.metadata:
            help_text += f" Range: {range_text(f.metadata['range'])}."
        if "choices" in f.metadata:
            help_text += " Allowed: " + ", ".join(f"`{c}`" for c in f.metadata["choices"]) + "."
        lines.append(f"| `{key}` | {type_name} | `{default!r}` | {help_text.replace('|', '/')} |")
    return "\n".join(lines) + "\n"
