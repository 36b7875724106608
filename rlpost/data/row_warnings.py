"""What loaded rows say about the run before its first step: validation prompts that are training
prompts too, prompts with contradicting answers, a response cap too short for the answers, text the
tokenizer cannot read. Each a warning (or None); `controller/setup.py` says them."""

from __future__ import annotations

import itertools

from rlpost.data.dataset import PromptRow


def overlap_warning(train: list[PromptRow], val: list[PromptRow]) -> str | None:
    """Validation prompts that are training prompts too (the same file, a copy of it, or rows in
    both), counted: their accuracy is not a held-out one."""
    seen = {row.prompt_text for row in train}
    if shared := sum(row.prompt_text in seen for row in val):
        return (
            f"warning: {shared} of the {len(val)} validation prompts are training prompts too: the validation "
            "accuracy is not held out"
        )
    return None


def conflict_warning(rows: list[PromptRow]) -> str | None:
    """Prompts that appear more than once with different ground truths (a merge of two files, an
    answer column shifted): each copy is trained against its own answer, so at most one is right."""
    answers: dict[str, set[str]] = {}
    for row in rows:
        answers.setdefault(row.prompt_text, set()).add(row.ground_truth)
    conflicts = [(prompt, sorted(found)) for prompt, found in answers.items() if len(found) > 1]
    if conflicts:
        prompt, found = conflicts[0]
        return (
            f"warning: {len(conflicts)} training prompts appear with different ground truths, so the reward "
            f"contradicts itself on them (the first: {prompt[:80]!r} with {', '.join(map(repr, found[:3]))})"
        )
    return None


def copy_warning(rows: list[PromptRow], files: dict[str, range]) -> str | None:
    """A training file whose rows (prompt and ground truth) all come again in another listed file: a
    copy under another name, or a part of an "all" file listed beside it (the seventeenth catalogue's
    t148). Its rows are trained on twice as often as the rest; said with both names."""
    content = {src: {(rows[i].prompt_text, rows[i].ground_truth) for i in span} for src, span in files.items()}
    for a, b in itertools.combinations(content, 2):
        part, whole = (a, b) if content[a] <= content[b] else (b, a)
        if content[part] and content[part] <= content[whole]:
            return (
                f"warning: every row of {part} (prompt and ground truth) is in {whole} too, so those rows are "
                "trained on at least twice as often as the rest: list one of the two files"
            )
    return None


def short_cap_warning(rows: list[PromptRow], tokenizer, max_response_length: int) -> str | None:
    """A response cap shorter than the longest ground truth's tokens and an eos: a response that
    holds the answer cannot fit, so those rows score nothing (said before the first step). The answer
    is the ground truth without the spaces around it, as the scorers compare it (the sixteenth
    catalogue's t11: "130 " drew the warning, yet scored)."""
    longest = max((row.ground_truth.strip() for row in rows), key=len, default=None)
    need = len(tokenizer(longest, add_special_tokens=False)["input_ids"]) + 1 if longest else 0
    if need > max_response_length:
        return (
            f"warning: rollout.max_response_length={max_response_length} tokens cannot hold the longest ground truth "
            f"({longest[:40]!r}: {need} tokens with the eos); raise it, or those rows score nothing"
        )
    return None


def unknown_token_warning(rows: list[PromptRow], tokenizer) -> str | None:
    """Prompts the tokenizer could only partly read (text it maps to its unknown token: a
    character-level tokenizer given characters it lacks), or that hold the text of its padding token
    (`<pad>` in scraped text: read as that token, a padding the model never saw: the sixteenth
    catalogue's t148), said with the first of them."""
    unk, pad = getattr(tokenizer, "unk_token_id", None), getattr(tokenizer, "pad_token_id", None)
    found = [row for row in rows if unk is not None and unk in row.prompt_ids]
    if found:
        return (
            f"warning: {len(found)} prompts hold text that the tokenizer maps to its unknown token "
            f"{tokenizer.unk_token!r}, which the model cannot read (the first: {found[0].prompt_text[:80]!r})"
        )
    padded = [row for row in rows if pad is not None and pad != tokenizer.eos_token_id and pad in row.prompt_ids]
    if padded:
        return (
            f"warning: {len(padded)} prompts hold the text of the tokenizer's padding token {tokenizer.pad_token!r}, "
            f"read as that token, a padding the model never learned to read (the first: "
            f"{padded[0].prompt_text[:80]!r}): take it out of the prompts"
        )
    return None
