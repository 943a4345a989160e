"""A tiny llama-architecture GGUF model that llama.cpp loads and runs in
milliseconds: random weights (a fixed seed), a byte-level SentencePiece-style
vocabulary and a ChatML chat template that refuses
consecutive messages of one role.

Run as a script, it writes the model to the path given::

    python tests/llamacpp/tiny_model.py /tmp/tiny.gguf

The vocabulary: ``<unk>``, ``<s>`` (BOS), ``</s>`` (EOS), the chat markers
``<|im_start|>`` and ``<|im_end|>``, the 256 byte tokens ``<0x00>`` to
``<0xFF>`` (the fallback for any character the vocabulary lacks, as in
LLaMA's own tokenizer) and one token per printable ASCII character, ``▁``
standing for the space. No merges: a printable ASCII character is one token,
anything else one token per UTF-8 byte, so counts are easy to reason about.

Random weights would end a reply at once (or after a few tokens) whenever the
end-of-generation token happened to win, and could emit bytes that are not
valid UTF-8. The model therefore emits only the printable tokens: dimension 0
of the residual stream is held at a constant (every embedding has 1.0 there,
and no attention or feed-forward output writes to it), so after the final
RMS norm it is always positive; each row of the output matrix for a token
that must never be generated (the special tokens and the byte tokens) has
-10,000 in that column and zeros elsewhere, a logit far below the printable
tokens' (a few units either way) at any temperature. Every reply thus runs
to its ``max_tokens`` (finish reason ``length``), long enough to stream
progress, and is plain ASCII.
"""

from __future__ import annotations

import sys
from pathlib import Path

import gguf
import numpy as np

CONTEXT = 256  # the context the model was "trained" with (llama.cpp pads to 256)
# Wide enough that a reply of 64 tokens takes a few hundred milliseconds on
# one CPU thread (long enough for several progress posts), small enough to
# write in a fraction of a second (about 47 MB).
EMBEDDING = 768
HEADS = 8
FEED_FORWARD = 1536
LAYERS = 2
SEED = 1234

UNK, BOS, EOS, IM_START, IM_END = range(5)
SPECIALS = ("<unk>", "<s>", "</s>", "<|im_start|>", "<|im_end|>")
BYTES = tuple(f"<0x{b:02X}>" for b in range(256))
PRINTABLE = tuple("▁" if c == " " else c for c in map(chr, range(32, 127)))
TOKENS = (*SPECIALS, *BYTES, *PRINTABLE)
FIRST_PRINTABLE = len(SPECIALS) + len(BYTES)

# ChatML, as many instruct models ship it, refusing (as the templates of
# Llama 2, Mistral or Gemma do) a conversation whose roles do not alternate.
CHAT_TEMPLATE = (
    "{% for message in messages %}"
    "{% if loop.index0 > 0 and message['role'] == messages[loop.index0 - 1]['role'] %}"
    "{{ raise_exception('Conversation roles must alternate') }}"
    "{% endif %}"
    "{{ '<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>' + '\\n' }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}"
)


def token_types() -> list[int]:
    types = [int(gguf.TokenType.UNKNOWN)] + [int(gguf.TokenType.CONTROL)] * 4
    types += [int(gguf.TokenType.BYTE)] * len(BYTES)
    types += [int(gguf.TokenType.NORMAL)] * len(PRINTABLE)
    return types


def weights(rng: np.random.Generator) -> dict[str, np.ndarray]:
    """The tensors, in numpy's (rows, columns) order: ``y = W @ x``."""

    def random(rows: int, columns: int) -> np.ndarray:
        # Scaled by the fan-in, so that no layer swamps the constant dimension.
        values: np.ndarray = rng.standard_normal((rows, columns)) / np.sqrt(columns)
        return values.astype(np.float32)

    def ones(n: int) -> np.ndarray:
        return np.ones(n, dtype=np.float32)

    vocab = len(TOKENS)
    embeddings = rng.standard_normal((vocab, EMBEDDING)).astype(np.float32)
    embeddings[:, 0] = 1.0  # the constant dimension (see the module docstring)
    tensors = {"token_embd.weight": embeddings, "output_norm.weight": ones(EMBEDDING)}
    for layer in range(LAYERS):
        blk = f"blk.{layer}"
        attn_output = random(EMBEDDING, EMBEDDING)
        attn_output[0, :] = 0.0  # writes nothing to the constant dimension
        ffn_down = random(EMBEDDING, FEED_FORWARD)
        ffn_down[0, :] = 0.0
        tensors |= {
            f"{blk}.attn_norm.weight": ones(EMBEDDING),
            f"{blk}.attn_q.weight": random(EMBEDDING, EMBEDDING),
            f"{blk}.attn_k.weight": random(EMBEDDING, EMBEDDING),
            f"{blk}.attn_v.weight": random(EMBEDDING, EMBEDDING),
            f"{blk}.attn_output.weight": attn_output,
            f"{blk}.ffn_norm.weight": ones(EMBEDDING),
            f"{blk}.ffn_gate.weight": random(FEED_FORWARD, EMBEDDING),
            f"{blk}.ffn_up.weight": random(FEED_FORWARD, EMBEDDING),
            f"{blk}.ffn_down.weight": ffn_down,
        }
    output = 2.0 * random(vocab, EMBEDDING)  # logits of a few units
    output[:, 0] = 0.0
    output[:FIRST_PRINTABLE, :] = 0.0
    output[:FIRST_PRINTABLE, 0] = -10_000.0  # never generated
    tensors["output.weight"] = output
    return tensors


def write_tiny_model(path: Path, *, seed: int = SEED, context: int = CONTEXT) -> Path:
    """Write the model to ``path``; returns ``path``. ``context``: the
    training context it declares (llama-server caps a slot at it)."""
    writer = gguf.GGUFWriter(str(path), "llama")
    writer.add_name("hordelite-tiny")
    writer.add_context_length(context)
    writer.add_embedding_length(EMBEDDING)
    writer.add_block_count(LAYERS)
    writer.add_feed_forward_length(FEED_FORWARD)
    writer.add_head_count(HEADS)
    writer.add_head_count_kv(HEADS)
    writer.add_rope_dimension_count(EMBEDDING // HEADS)
    writer.add_layer_norm_rms_eps(1e-5)
    writer.add_vocab_size(len(TOKENS))
    writer.add_file_type(gguf.LlamaFileType.ALL_F32)

    writer.add_tokenizer_model("llama")
    writer.add_tokenizer_pre("default")
    writer.add_token_list(list(TOKENS))
    writer.add_token_scores([0.0] * len(TOKENS))
    writer.add_token_types(token_types())
    writer.add_unk_token_id(UNK)
    writer.add_bos_token_id(BOS)
    writer.add_eos_token_id(EOS)
    writer.add_eot_token_id(IM_END)
    writer.add_add_bos_token(True)
    writer.add_add_eos_token(False)
    writer.add_add_space_prefix(False)
    writer.add_chat_template(CHAT_TEMPLATE)

    for name, tensor in weights(np.random.default_rng(seed)).items():
        writer.add_tensor(name, tensor)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return path


if __name__ == "__main__":
    print(write_tiny_model(Path(sys.argv[1])))
