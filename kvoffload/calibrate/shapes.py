"""Model shapes that calibration builds random weights for, and the sizes derived from them.

Pure data and arithmetic: no torch, no IO. The figures are those of the public model configs
(`config.json` on the Hugging Face hub) named in `source`; only the shape matters, never the weights.
"""

from __future__ import annotations

from dataclasses import dataclass

from kvoffload.errors import UserError

DTYPE_BYTES = {"bf16": 2, "fp16": 2, "fp32": 4}


@dataclass(frozen=True)
class ModelSpec:
    """The dimensions of a decoder-only transformer with grouped-query attention and a gated MLP."""

    name: str
    source: str
    num_layers: int
    hidden: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    intermediate: int
    vocab: int
    qk_norm: bool = False

    @property
    def q_width(self) -> int:
        return self.num_heads * self.head_dim

    @property
    def kv_width(self) -> int:
        return self.num_kv_heads * self.head_dim

    def layer_matmul_params(self) -> int:
        """Parameters of one layer's projections (q, k, v, o, gate, up, down); norms are negligible."""
        attn = self.hidden * (self.q_width + 2 * self.kv_width) + self.q_width * self.hidden
        mlp = 3 * self.hidden * self.intermediate
        return attn + mlp

    def total_params(self) -> int:
        """All parameters: layers plus untied input embedding and output head."""
        return self.num_layers * self.layer_matmul_params() + 2 * self.vocab * self.hidden

    def weights_bytes(self, dtype: str = "bf16") -> int:
        return self.total_params() * DTYPE_BYTES[dtype]

    def kv_bytes_per_token_per_layer(self, dtype: str = "bf16") -> int:
        return 2 * self.kv_width * DTYPE_BYTES[dtype]

    def kv_bytes_per_token(self, dtype: str = "bf16") -> int:
        """K and V of one token over all layers: 2 * layers * kv_heads * head_dim * dtype bytes."""
        return self.num_layers * self.kv_bytes_per_token_per_layer(dtype)

    def layer_prefill_flops(self, tokens: int) -> float:
        """FLOPs of one layer prefilling `tokens` from scratch: projections plus causal attention.

        Projections: 2 FLOPs per parameter per token. Attention: QK^T and PV over the causal half,
        2 * 2 * heads * head_dim * tokens^2 / 2.
        """
        return 2.0 * self.layer_matmul_params() * tokens + 2.0 * self.q_width * float(tokens) ** 2

    def layer_decode_bytes(self, batch: int, context: int, dtype: str = "bf16") -> float:
        """Fewest device-memory bytes one layer's decode step reads: its weights and the batch's KV."""
        weights = self.layer_matmul_params() * DTYPE_BYTES[dtype]
        return float(weights + batch * context * self.kv_bytes_per_token_per_layer(dtype))

    def head_bytes(self, dtype: str = "bf16") -> int:
        """Bytes of the output projection (lm_head), read once per step."""
        return self.vocab * self.hidden * DTYPE_BYTES[dtype]


SHAPES: dict[str, ModelSpec] = {
    spec.name: spec
    for spec in (
        ModelSpec(
            name="llama-8b",
            source="meta-llama/Llama-3.1-8B-Instruct config.json",
            num_layers=32,
            hidden=4096,
            num_heads=32,
            num_kv_heads=8,
            head_dim=128,
            intermediate=14336,
            vocab=128256,
        ),
        ModelSpec(
            name="llama-70b",
            source="meta-llama/Llama-3.1-70B-Instruct config.json",
            num_layers=80,
            hidden=8192,
            num_heads=64,
            num_kv_heads=8,
            head_dim=128,
            intermediate=28672,
            vocab=128256,
        ),
        ModelSpec(
            name="qwen3-8b",
            source="Qwen/Qwen3-8B config.json",
            num_layers=36,
            hidden=4096,
            num_heads=32,
            num_kv_heads=8,
            head_dim=128,
            intermediate=12288,
            vocab=151936,
            qk_norm=True,
        ),
        ModelSpec(
            name="qwen3-32b",
            source="Qwen/Qwen3-32B config.json",
            num_layers=64,
            hidden=5120,
            num_heads=64,
            num_kv_heads=8,
            head_dim=128,
            intermediate=25600,
            vocab=151936,
            qk_norm=True,
        ),
        ModelSpec(
            name="tiny",
            source="synthetic: a toy shape for smoke tests on a CPU; its figures mean nothing",
            num_layers=2,
            hidden=256,
            num_heads=4,
            num_kv_heads=2,
            head_dim=64,
            intermediate=512,
            vocab=1024,
        ),
    )
}


def get_shape(name: str) -> ModelSpec:
    """The shape called `name`, or a UserError naming the flag and the known shapes."""
    try:
        return SHAPES[name]
    except KeyError:
        raise UserError(
            f"--model-shape {name}: unknown shape; known shapes are {', '.join(sorted(SHAPES))}"
        ) from None
