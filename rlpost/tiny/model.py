"""The tiny model's parts that need no download: `build_char_tokenizer` makes a character-level
tokenizer (one token per character, `<eos>` and `<pad>` specials) that saves and loads like any
Hugging Face tokenizer, `tiny_qwen2_config` a Qwen2- (or Llama-) shaped decoder config of the
requested size. Building and warming them up is `rlpost.tiny.build` and `rlpost.tiny.warmup`.
"""

from __future__ import annotations

PAD, EOS, UNK = "<pad>", "<eos>", "<unk>"
CHARS = "0123456789+-*/=()., ?!:;'\"\n#$%<>_" + "abcdefghijklmnopqrstuvwxyz" + "ABCDEFGHIJKLMNOPQRSTUVWXYZ"
# Messages are rendered as plain text so the character vocabulary covers the template itself.
CHAT_TEMPLATE = (
    "{% for m in messages %}{{ m['role'] }}: {{ m['content'] }}\n{% endfor %}"
    "{% if add_generation_prompt %}assistant: {% endif %}"
)


TOOL_CHARS = "{}[]"  # JSON's: tool calls need them (the arithmetic model's vocabulary stays as it was)


def build_char_tokenizer(vocab_size: int | None = None, extra_chars: str = ""):
    """A character-level `PreTrainedTokenizerFast`: ids 0..2 are pad, eos, unk, then `CHARS` and
    `extra_chars`. With `vocab_size`, filler tokens `<xN>` pad the vocabulary so that every id of
    a larger model decodes."""
    from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    tokens = [PAD, EOS, UNK, *CHARS, *extra_chars]
    tokens += [f"<x{i}>" for i in range(len(tokens), vocab_size or 0)]
    vocab = {t: i for i, t in enumerate(tokens)}
    tok = Tokenizer(models.WordLevel(vocab=vocab, unk_token=UNK))
    tok.pre_tokenizer = pre_tokenizers.Split(Regex("."), behavior="isolated")
    tok.decoder = decoders.Fuse()
    tokenizer = PreTrainedTokenizerFast(
        tokenizer_object=tok, pad_token=PAD, eos_token=EOS, unk_token=UNK, padding_side="left"
    )
    tokenizer.chat_template = CHAT_TEMPLATE
    return tokenizer


def tiny_qwen2_config(
    vocab_size: int,
    hidden_size: int,
    num_layers: int,
    num_heads: int,
    num_kv_heads: int,
    intermediate_size: int,
    max_position: int,
    pad_token_id: int,
    eos_token_id: int,
    family: str = "qwen2",
    tied: bool = True,
):
    """A decoder config of the requested size: Qwen2 (q/k/v biases), or with `family="llama"`
    Llama (no biases, as SmolLM2 and Llama 3); embeddings tied to the output head unless `tied`
    is false."""
    from transformers import LlamaConfig, Qwen2Config

    configs = {"qwen2": Qwen2Config, "llama": LlamaConfig}
    if family not in configs:
        raise ValueError(f"tiny model family must be one of {sorted(configs)}, got {family!r}")
    return configs[family](
        vocab_size=vocab_size,
        hidden_size=hidden_size,
        num_hidden_layers=num_layers,
        num_attention_heads=num_heads,
        num_key_value_heads=num_kv_heads,
        intermediate_size=intermediate_size,
        max_position_embeddings=max_position,
        tie_word_embeddings=tied,
        pad_token_id=pad_token_id,
        eos_token_id=eos_token_id,
        bos_token_id=eos_token_id,
        torch_dtype="float32",
    )
