"""Model configs the tests share: config.json shapes whose KV bytes per token are worked out by hand."""

from __future__ import annotations

from typing import Any

# Llama-3.1-8B's shape: 32 layers, GQA with 8 KV heads of 32 query heads, head_dim 128, bfloat16.
LLAMA_8B: dict[str, Any] = {
    "num_hidden_layers": 32,
    "num_attention_heads": 32,
    "num_key_value_heads": 8,
    "head_dim": 128,
    "hidden_size": 4096,
    "torch_dtype": "bfloat16",
}
# 2 (K, V) x 32 layers x 8 KV heads x 128 x 2 B = 131072 B per token of a whole replica.
LLAMA_8B_KV = 131072
