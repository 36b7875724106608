"""`Batch`: a dict of tensors that share their first dimension, the unit every part passes around.

A generated batch holds (see docs/token-layout.md):

| key               | shape  | meaning                                                        |
| ----------------- | ------ | -------------------------------------------------------------- |
| `prompt_ids`      | [B, P] | prompt tokens, left-padded                                     |
| `prompt_mask`     | [B, P] | True on real prompt tokens                                     |
| `response_ids`    | [B, R] | response tokens, right-padded                                  |
| `response_mask`   | [B, R] | True on real response tokens (the EOS that ended it included) |
| `loss_mask`       | [B, R] | True on the response tokens that get a loss: the model's own   |
|                   |        | (single-turn: all of them; a tool's or environment's: False)   |
| `rollout_logprobs`| [B, R] | log-prob of each response token under the rollout's weights    |
| `weight_version`  | [B]    | version of the weights that generated the sample              |
| `group_ids`       | [B]    | samples of one prompt share a group id                         |

Later stages add `old_logprobs`, `ref_logprobs` ([B, R]) and `advantages` ([B]).
Only `rlpost.data.padding` changes the layout; a `Batch` only splits and selects rows.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch


@dataclass
class Batch:
    tensors: dict[str, torch.Tensor] = field(default_factory=dict)

    def __post_init__(self):
        sizes = {k: v.shape[0] for k, v in self.tensors.items()}
        if len(set(sizes.values())) > 1:
            raise ValueError(f"Batch tensors disagree on the batch size: {sizes}")

    def __len__(self) -> int:
        return next(iter(self.tensors.values())).shape[0] if self.tensors else 0

    def __getitem__(self, key: str) -> torch.Tensor:
        try:
            return self.tensors[key]
        except KeyError:
            raise KeyError(f"Batch has no {key!r}; it has {sorted(self.tensors)}") from None

    def __setitem__(self, key: str, value: torch.Tensor) -> None:
        if self.tensors and value.shape[0] != len(self):
            raise ValueError(f"Batch[{key!r}] has {value.shape[0]} rows, the batch has {len(self)}")
        self.tensors[key] = value

    def __contains__(self, key: str) -> bool:
        return key in self.tensors

    def keys(self):
        return self.tensors.keys()

    def select(self, index: torch.Tensor | list[int] | slice) -> "Batch":
        """Rows `index` of every tensor (a slice, a list of row numbers or a bool/long tensor)."""
        if isinstance(index, list):
            index = torch.tensor(index, dtype=torch.long)
        return Batch({k: v[index] for k, v in self.tensors.items()})

    def chunk(self, n: int) -> list["Batch"]:
        """`n` contiguous chunks of equal size (data-parallel shards)."""
        if len(self) % n:
            raise ValueError(f"a batch of {len(self)} rows cannot be split evenly into {n} shards")
        size = len(self) // n
        return [self.select(slice(i * size, (i + 1) * size)) for i in range(n)]

    def to(self, device: torch.device | str) -> "Batch":
        return Batch({k: v.to(device) for k, v in self.tensors.items()})

    @staticmethod
    def cat(batches: list["Batch"]) -> "Batch":
        """Concatenate along rows. Tensors must already share their trailing shapes
        (use `padding.concat_generations` for generation batches of different widths)."""
        keys = batches[0].keys()
        for b in batches[1:]:
            if b.keys() != keys:
                raise ValueError(f"cannot concatenate batches with keys {sorted(keys)} and {sorted(b.keys())}")
        return Batch({k: torch.cat([b[k] for b in batches]) for k in keys})
