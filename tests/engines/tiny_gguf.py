"""A tiny llama-architecture model in GGUF, written with the ``gguf`` package: a few layers of
random weights and a byte-level SentencePiece vocabulary. Its text is noise; what it exercises
is a real server's loading, streaming and model listing."""

from __future__ import annotations

from pathlib import Path

import gguf
import numpy as np

EMBED = 64
HEADS = 4
FFN = 128
LAYERS = 2
CONTEXT = 512
PIECES = [chr(c) for c in range(ord("a"), ord("z") + 1)] + ["▁" + w for w in ("the", "a", "gate")]


def write_tiny_llama(path: Path, seed: int = 7) -> Path:
    rng = np.random.default_rng(seed)
    tokens = ["<unk>", "<s>", "</s>", *(f"<0x{b:02X}>" for b in range(256)), "▁", *PIECES]
    types = [
        gguf.TokenType.UNKNOWN,
        gguf.TokenType.CONTROL,
        gguf.TokenType.CONTROL,
        *([gguf.TokenType.BYTE] * 256),
        *([gguf.TokenType.NORMAL] * (1 + len(PIECES))),
    ]
    vocab = len(tokens)
    writer = gguf.GGUFWriter(str(path), "llama")
    writer.add_name("warmgate-tiny")
    writer.add_context_length(CONTEXT)
    writer.add_embedding_length(EMBED)
    writer.add_block_count(LAYERS)
    writer.add_feed_forward_length(FFN)
    writer.add_head_count(HEADS)
    writer.add_head_count_kv(HEADS)
    writer.add_rope_dimension_count(EMBED // HEADS)
    writer.add_layer_norm_rms_eps(1e-5)
    writer.add_file_type(gguf.LlamaFileType.ALL_F32)
    writer.add_tokenizer_model("llama")
    writer.add_token_list(tokens)
    writer.add_token_scores([0.0] * 259 + [-float(i) for i in range(vocab - 259)])
    writer.add_token_types(types)
    writer.add_bos_token_id(1)
    writer.add_eos_token_id(2)
    writer.add_unk_token_id(0)

    def weights(*shape: int) -> np.ndarray:
        return (rng.standard_normal(shape) * 0.02).astype(np.float32)

    writer.add_tensor("token_embd.weight", weights(vocab, EMBED))
    writer.add_tensor("output_norm.weight", np.ones(EMBED, dtype=np.float32))
    writer.add_tensor("output.weight", weights(vocab, EMBED))
    for i in range(LAYERS):
        block = f"blk.{i}"
        writer.add_tensor(f"{block}.attn_norm.weight", np.ones(EMBED, dtype=np.float32))
        for name in ("attn_q", "attn_k", "attn_v", "attn_output"):
            writer.add_tensor(f"{block}.{name}.weight", weights(EMBED, EMBED))
        writer.add_tensor(f"{block}.ffn_norm.weight", np.ones(EMBED, dtype=np.float32))
        writer.add_tensor(f"{block}.ffn_gate.weight", weights(FFN, EMBED))
        writer.add_tensor(f"{block}.ffn_up.weight", weights(FFN, EMBED))
        writer.add_tensor(f"{block}.ffn_down.weight", weights(EMBED, FFN))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return path
