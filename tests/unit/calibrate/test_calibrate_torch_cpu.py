"""The measurement code itself, run with torch on the CPU at a toy shape (skipped without torch).

These check that the layer implementations compute the right function; timings on a CPU mean nothing.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from kvoffload.calibrate import gpu, layers
from kvoffload.calibrate.shapes import get_shape
from kvoffload.cli.main import main
from kvoffload.sim.profile import load_profile

torch = pytest.importorskip("torch", reason="torch not installed (pip install 'kvoffload-lab[calibrate]')")


@pytest.mark.parametrize("shape", ["tiny", "qwen3-8b"])
def test_decode_step_matches_the_last_prefill_position(shape: str) -> None:
    """Prefill over T tokens and a decode step for token T-1 over the first T-1 cached tokens must give
    the same output: checks rotary positions, GQA grouping, KV-cache writes and both attention paths."""
    spec = get_shape(shape)
    if shape != "tiny":  # one layer of a real shape, few tokens: seconds on a CPU
        spec = type(spec)(**{**spec.__dict__, "intermediate": 256})
    torch.manual_seed(1)
    dev = torch.device("cpu")
    layer = layers.make_layer(torch, spec, dev)
    t = 40
    x = torch.randn(t, spec.hidden, dtype=torch.bfloat16)
    shape_kv = (spec.num_kv_heads, t, spec.head_dim)
    cache = (torch.empty(shape_kv, dtype=torch.bfloat16), torch.empty(shape_kv, dtype=torch.bfloat16))
    rope = layers.rope_tables(torch, torch.arange(t), spec.head_dim)
    full = layers.prefill_layer(torch, spec, layer, x, rope, cache, layers.causal_sdpa(torch))
    for impl in ("sdpa", "matmul"):
        dcache = (cache[0].clone().unsqueeze(0), cache[1].clone().unsqueeze(0))
        dcache[0][:, :, -1].normal_()  # the step must overwrite the last slot itself
        step = layers.decode_layer(
            torch,
            spec,
            layer,
            x[t - 1 :],
            layers.rope_tables(torch, torch.tensor([t - 1]), spec.head_dim),
            dcache,
            layers.decode_attention(torch, impl),
        )
        err = float((step[0].double() - full[t - 1].double()).norm() / full[t - 1].double().norm())
        assert err < 2e-2, impl


def test_transfer_fit_recovers_bandwidth_and_overhead() -> None:
    chunk = 32 << 20
    pts = [
        gpu.TransferPoint(direction=d, nbytes=n, seconds=20e-6 + n / 50e9, gbps=n / (20e-6 + n / 50e9) / 1e9)
        for d in ("h2d", "d2h")
        for n in (1 << 20, chunk, 8 * chunk)
    ]
    result = gpu.transfer_result(pts, chunk)
    assert result.host_to_device_gbps == pytest.approx(50.0, rel=0.01)
    assert result.per_chunk_overhead_s == pytest.approx(20e-6, abs=3e-6)


def test_decode_grid_keeps_kv_within_memory() -> None:
    spec = get_shape("llama-8b")
    grid = gpu.grids("cuda", quick=False)
    mem = 150_109_880_320
    points = gpu.decode_grid(spec, grid, mem)
    budget = 0.9 * mem - spec.weights_bytes()
    assert points and all(b * c * spec.kv_bytes_per_token() <= budget and fits for b, c, fits in points)
    assert (1, 131072, True) in points
    big = gpu.decode_grid(get_shape("llama-70b"), grid, mem)
    assert big and all(not fits and b * c <= 262144 for b, c, fits in big)


def test_cli_end_to_end_on_cpu(tmp_path: Path) -> None:
    out = tmp_path / "tiny-cpu.yaml"
    args = [
        "calibrate",
        "--model-shape",
        "tiny",
        "--device",
        "cpu",
        "--output",
        str(out),
        "--disk-bytes",
        "4M",
    ]
    assert main(args) == 0
    raw = json.loads((tmp_path / "tiny-cpu.raw.json").read_text(encoding="utf-8"))
    assert raw["environment"]["device_type"] == "cpu"
    assert raw["disk"]["path"] == str(tmp_path.resolve())
    profile = load_profile(str(out))
    assert [c for c, _ in profile.prefill.points] == list(gpu.grids("cpu", quick=False).prefill_contexts)
    assert profile.provenance.prefill.method.count("a host clock") == 1


def test_reference_attention_is_causal_gqa() -> None:
    """The float64 reference that vets each SDPA backend agrees with SDPA's own GQA path."""
    q = torch.randn(1, 8, 50, 16)
    k = torch.randn(1, 2, 50, 16)
    v = torch.randn(1, 2, 50, 16)
    ref = layers.reference_attention(torch, q, k, v)
    sdpa = torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=True)
    assert float((ref - sdpa.double()).abs().max()) < 1e-5
    shifted = layers.reference_attention(torch, q, k, torch.cat([v[:, :, :49], v[:, :, 49:] + 1], dim=2))
    assert torch.equal(shifted[:, :, :49], ref[:, :, :49])  # no position sees a later one
