"""The shard rules (`rlpost.rollout.vllm_shards`) against vLLM's own weight loaders: each of vLLM's
parallel layers is built as shard r of T (vLLM's tensor-parallel rank and size patched in, no
process group), random full HF tensors go through the layer's `weight_loader`, and the rule must
name exactly the part of the parameter that holds them and the slice of the HF tensor it is, for
T = 1, 2, 4, every rank, key/value heads fewer than, equal to and more than the shards, and a
vocabulary that no shard count divides. Then `shard_view`, which the engine reads back through, on
a model's parameters by name."""

import pytest
import torch

pytest.importorskip("vllm")

from rlpost.rollout.vllm_shards import Layer, Slice, held_part, layer_of, shard_slice  # noqa: E402
from rlpost.rollout.vllm_weights import shard_view  # noqa: E402
from rlpost.weightsync.manifest import TensorSpec  # noqa: E402

HIDDEN, HEAD = 32, 4


@pytest.fixture
def shard(monkeypatch):
    """shard(rank, size): a context in which vLLM's layers are built as shard `rank` of `size`."""
    import contextlib

    import vllm.model_executor.layers.linear as linear
    import vllm.model_executor.layers.vocab_parallel_embedding as vocab
    import vllm.model_executor.parameter as parameter
    from vllm.config import VllmConfig, set_current_vllm_config

    @contextlib.contextmanager
    def context(rank: int, size: int):
        for module in (linear, vocab, parameter):
            monkeypatch.setattr(module, "get_tensor_model_parallel_rank", lambda: rank, raising=False)
            monkeypatch.setattr(module, "get_tensor_model_parallel_world_size", lambda: size, raising=False)
        with set_current_vllm_config(VllmConfig()):
            yield

    return context


def check(module, param: torch.Tensor, full: torch.Tensor, pieces=None, piece=0) -> Slice:
    """The rule's slice of `full` equals the part of `param` it names, and that part is all the
    loader wrote there (the rest of the piece's rows are another piece's)."""
    s = shard_slice(layer_of(module), tuple(full.shape), pieces, piece)
    assert s is not None
    held = held_part(param.data, s, tuple(full.shape))
    assert held is not None
    assert torch.equal(held, full.narrow(s.dim, s.full, s.length)), s
    return s


RANKS = [(r, t) for t in (1, 2, 4) for r in range(t)]


@pytest.mark.parametrize("rank,size", RANKS)
@pytest.mark.parametrize("kv_heads", [1, 2, 8])
def test_q_k_v_shards_are_where_the_rule_says(shard, rank, size, kv_heads):
    from vllm.model_executor.layers.linear import QKVParallelLinear

    heads = HIDDEN // HEAD
    with shard(rank, size):
        layer = QKVParallelLinear(HIDDEN, HEAD, heads, kv_heads, bias=True)
    q = torch.randn(heads * HEAD, HIDDEN)
    k, v = torch.randn(kv_heads * HEAD, HIDDEN), torch.randn(kv_heads * HEAD, HIDDEN)
    for name, tensor in zip("qkv", (q, k, v)):
        layer.weight.weight_loader(layer.weight, tensor, name)
        layer.bias.weight_loader(layer.bias, tensor[:, 0].clone(), name)
    pieces = [q.shape[0], k.shape[0], v.shape[0]]
    spans = [check(layer, layer.weight, t, pieces, i) for i, t in enumerate((q, k, v))]
    for i, t in enumerate((q, k, v)):
        check(layer, layer.bias, t[:, 0].clone(), pieces, i)
    assert spans[-1].held + spans[-1].length == layer.weight.shape[0]  # the pieces fill the parameter
    if kv_heads < size:  # shards share key/value heads: each holds one head, its group's
        assert spans[1] == Slice(0, spans[0].length, rank // (size // kv_heads) * HEAD, HEAD)


@pytest.mark.parametrize("rank,size", RANKS)
def test_gate_up_and_column_shards_are_where_the_rule_says(shard, rank, size):
    from vllm.model_executor.layers.linear import ColumnParallelLinear, MergedColumnParallelLinear

    with shard(rank, size):
        merged = MergedColumnParallelLinear(HIDDEN, [64, 64], bias=False)
        column = ColumnParallelLinear(HIDDEN, 48, bias=True)
    gate, up = torch.randn(64, HIDDEN), torch.randn(64, HIDDEN)
    merged.weight.weight_loader(merged.weight, gate, 0)
    merged.weight.weight_loader(merged.weight, up, 1)
    assert check(merged, merged.weight, gate, [64, 64], 0) == Slice(0, 0, rank * 64 // size, 64 // size)
    assert check(merged, merged.weight, up, [64, 64], 1) == Slice(0, 64 // size, rank * 64 // size, 64 // size)
    w, b = torch.randn(48, HIDDEN), torch.randn(48)
    column.weight.weight_loader(column.weight, w)
    column.bias.weight_loader(column.bias, b)
    check(column, column.weight, w)
    check(column, column.bias, b)


@pytest.mark.parametrize("rank,size", RANKS)
def test_row_shards_split_the_input_and_keep_the_bias_whole(shard, rank, size):
    from vllm.model_executor.layers.linear import RowParallelLinear

    with shard(rank, size):
        layer = RowParallelLinear(64, HIDDEN, bias=True)
    w, b = torch.randn(HIDDEN, 64), torch.randn(HIDDEN)
    layer.weight.weight_loader(layer.weight, w)
    layer.bias.weight_loader(layer.bias, b)
    assert check(layer, layer.weight, w) == Slice(1, 0, rank * 64 // size, 64 // size)
    assert check(layer, layer.bias, b) == Slice(0, 0, 0, HIDDEN)


@pytest.mark.parametrize("rank,size", RANKS)
@pytest.mark.parametrize("head", [False, True], ids=["embedding", "lm_head"])
def test_vocabulary_shards_hold_their_rows_then_padding(shard, rank, size, head):
    from vllm.model_executor.layers.vocab_parallel_embedding import ParallelLMHead, VocabParallelEmbedding

    vocab = 203  # no shard count divides it; vLLM pads each shard to a multiple of 64
    with shard(rank, size):
        layer = (ParallelLMHead if head else VocabParallelEmbedding)(vocab, HIDDEN)
    full = torch.randn(vocab, HIDDEN)
    layer.weight.weight_loader(layer.weight, full)
    s = check(layer, layer.weight, full)
    assert s.held == 0 and s.length <= layer.weight.shape[0]


def test_layers_vllm_does_not_split_are_whole():
    assert layer_of(torch.nn.LayerNorm(4)) == Layer()
    assert shard_slice(Layer(), (7, 3)) == Slice(0, 0, 0, 7)


def test_sizes_that_do_not_divide_and_repacked_weights_are_not_read_back():
    assert shard_slice(Layer("row", 0, 2), (4, 7)) is None
    assert shard_slice(Layer("column", 1, 4), (6, 4)) is None
    assert held_part(torch.empty(3, 3), Slice(0, 0, 0, 2), (2, 4)) is None  # another width
    assert held_part(torch.empty(0), Slice(0, 0, 0, 2), (2, 4)) is None  # a kernel's packing


def test_shard_view_reads_fused_padded_and_lora_wrapped_parameters_back():
    q, k, v = torch.randn(8, 4), torch.randn(2, 4), torch.randn(2, 4)
    column = Layer("column")
    held = {
        "l.qkv_proj.weight": (torch.cat([q, k, v]), column),
        "l.gate_up_proj.base_layer.weight": (torch.randn(12, 4), column),  # vLLM wrapped it for LoRA
        "embed.weight": (torch.randn(16, 4), Layer("vocab", rows=(0, 11))),  # 5 rows of padding
        "l.o_proj.weight": (torch.empty(0), Layer("row")),  # repacked by a kernel
    }
    manifest = {
        n: TensorSpec(n, s, "float32")
        for n, s in [
            ("l.q_proj.weight", (8, 4)),
            ("l.k_proj.weight", (2, 4)),
            ("l.v_proj.weight", (2, 4)),
            ("l.gate_proj.weight", (6, 4)),
            ("l.up_proj.weight", (6, 4)),
            ("embed.weight", (11, 4)),
            ("l.o_proj.weight", (4, 4)),
        ]
    }
    assert torch.equal(shard_view(held, manifest, "l.k_proj.weight")[0], k)
    assert torch.equal(shard_view(held, manifest, "l.v_proj.weight")[0], v)
    up = held["l.gate_up_proj.base_layer.weight"][0][6:]
    assert torch.equal(shard_view(held, manifest, "l.up_proj.weight")[0], up)
    assert torch.equal(shard_view(held, manifest, "embed.weight")[0], held["embed.weight"][0][:11])
    assert shard_view(held, manifest, "l.o_proj.weight") is None
