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

    def __reduce__(self):
        """Pickled (between Ray actors, into checkpoints) as numpy arrays: torch pickles each CPU
        tensor with a `torch.save` of its whole storage, 0.1 ms and more a tensor, where numpy's
        arrays take microseconds (and go through Ray's object store without a copy)."""
        return _unpickle_batch, ({k: _to_numpy(v) for k, v in self.tensors.items()},)

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


_SAME_SIZE_INT = {1: torch.uint8, 2: torch.int16, 4: torch.int32, 8: torch.int64}


def _to_numpy(t: torch.Tensor):
    """A CPU tensor as (a numpy array of its values, the dtype to view them as again or None);
    any other tensor (on a GPU, with a gradient) as itself, for torch's own pickling."""
    if t.device.type != "cpu" or t.requires_grad or t.layout != torch.strided:
        return t
    try:
        return t.numpy(), None
    except TypeError:  # bfloat16, float8: numpy has no such type; their bits travel as integers
        return t.view(_SAME_SIZE_INT[t.element_size()]).numpy(), t.dtype


def _unpickle_batch(tensors: dict) -> Batch:
    out = {}
    for k, v in tensors.items():
        if isinstance(v, tuple):
            array, dtype = v
            t = torch.from_numpy(array if array.flags.writeable else array.copy())  # Ray's are read-only
            v = t if dtype is None else t.view(dtype)
        out[k] = v
    return Batch(out)
