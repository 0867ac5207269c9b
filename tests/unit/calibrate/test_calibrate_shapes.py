"""Model shapes: KV bytes per token and weight sizes against the public configs."""

from __future__ import annotations

import pytest

from kvoffload.calibrate.shapes import SHAPES, get_shape
from kvoffload.errors import UserError


@pytest.mark.parametrize(
    ("name", "kv_bytes", "weights_gib"),
    [
        # 2 * layers * kv_heads * head_dim * 2 bytes; weights from the published parameter counts.
        ("llama-8b", 2 * 32 * 8 * 128 * 2, 14.96),
        ("qwen3-8b", 2 * 36 * 8 * 128 * 2, 15.26),
        ("llama-70b", 2 * 80 * 8 * 128 * 2, 131.4),
    ],
)
def test_kv_bytes_and_weights(name: str, kv_bytes: int, weights_gib: float) -> None:
    spec = get_shape(name)
    assert spec.kv_bytes_per_token() == kv_bytes
    assert spec.weights_bytes() / 2**30 == pytest.approx(weights_gib, abs=0.05)


def test_llama8b_parameter_count_matches_the_model_card() -> None:
    assert SHAPES["llama-8b"].total_params() == pytest.approx(8.03e9, rel=0.002)


def test_prefill_flops_grow_quadratically_with_context() -> None:
    spec = get_shape("llama-8b")
    linear = 2.0 * spec.layer_matmul_params()
    one, two = spec.layer_prefill_flops(1000), spec.layer_prefill_flops(2000)
    assert two - 2 * one == pytest.approx(2.0 * spec.q_width * (2000**2 - 2 * 1000**2))
    assert one > linear * 1000


def test_unknown_shape_names_the_flag_and_the_choices() -> None:
    with pytest.raises(UserError, match=r"--model-shape gpt-5: unknown shape; known shapes are .*llama-8b"):
        get_shape("gpt-5")
