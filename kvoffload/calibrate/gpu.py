"""PyTorch measurements of one model shape on one device: prefill, decode, KV copies, ceilings.

Builds random bf16 weights of the shape (no download), runs one decoder layer (`layers.py`, the way
vLLM computes it, attention through `torch.nn.functional.scaled_dot_product_attention`) and times it
with `timing.Timer` (CUDA events after a warm-up, medians of repeats: the device tool's METHOD.md).
Whole-model times are one layer's time times `num_layers` plus the output head, which lets shapes
whose weights do not fit one device (llama-70b on an H200) be measured; where the weights fit, a full
stack is timed too to check that the scaling holds. Decode steps are captured as CUDA graphs and
timed by replay, as vLLM runs them.

torch is imported inside functions only, so this module imports on hosts without it. Nothing here
writes files or prints; progress goes through `logging`.
"""

from __future__ import annotations

import logging
import math
import platform
import socket
import statistics
import subprocess
import warnings
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from kvoffload.calibrate.layers import (
    Attention,
    LayerWeights,
    causal_sdpa,
    decode_attention,
    decode_layer,
    make_layer,
    prefill_layer,
    random_weight,
    reference_attention,
    rel_err,
    rope_tables,
)
from kvoffload.calibrate.raw import (
    Ceilings,
    DecodePoint,
    DecodeResult,
    Environment,
    FullModelCheck,
    PrefillPoint,
    PrefillResult,
    TransferPoint,
    TransferResult,
)
from kvoffload.calibrate.shapes import ModelSpec
from kvoffload.calibrate.timing import Timer, graphed, import_torch, is_oom, release
from kvoffload.errors import UserError

if TYPE_CHECKING:
    from torch import Tensor
    from torch import device as Device

log = logging.getLogger(__name__)

CHUNK_TOKENS = 256  # LMCache's chunk: the unit the cpu and nvme tiers move
MEMORY_FRACTION = 0.9  # vLLM's default gpu_memory_utilization


@dataclass(frozen=True)
class Grids:
    """What to measure: prefill contexts, the decode grid, and how hard to repeat."""

    prefill_contexts: tuple[int, ...]
    full_model_contexts: tuple[int, ...]
    decode_batches: tuple[int, ...]
    decode_contexts: tuple[int, ...]
    warmup: int
    repeats: int
    decode_replays: int
    select_tokens: int


def grids(device_type: str, quick: bool) -> Grids:
    """Measurement grids: full ones on a GPU, smaller with --quick, toy ones on a CPU (smoke tests)."""
    if device_type == "cpu":
        return Grids((128, 512, 1024), (512,), (1, 2, 4), (128, 1024), 1, 3, 2, 128)
    if quick:
        return Grids((1024, 4096, 16384, 65536), (4096,), (1, 16, 64), (1024, 8192, 32768), 1, 3, 10, 8192)
    return Grids(
        prefill_contexts=(1024, 2048, 4096, 8192, 16384, 32768, 65536, 131072),
        full_model_contexts=(4096, 32768),
        decode_batches=(1, 4, 16, 64, 256),
        decode_contexts=(1024, 4096, 16384, 65536, 131072),
        warmup=2,
        repeats=5,
        decode_replays=20,
        select_tokens=16384,
    )


def environment(torch: Any, device: Device, started_at: str, argv: Sequence[str]) -> Environment:
    """Device, driver, torch and host facts for the provenance of every figure."""
    if device.type == "cuda":
        props = torch.cuda.get_device_properties(device)
        name, memory, sms = str(props.name), int(props.total_memory), int(props.multi_processor_count)
        driver = _nvidia_smi_field("driver_version")
    else:
        name, memory, sms, driver = f"CPU ({platform.processor() or platform.machine()})", 0, None, None
    return Environment(
        device_type=device.type,
        device_name=name,
        device_memory_bytes=memory,
        multiprocessors=sms,
        driver=driver,
        cuda=str(torch.version.cuda) if torch.version.cuda else None,
        torch=str(torch.__version__),
        python=platform.python_version(),
        hostname=socket.gethostname(),
        started_at=started_at,
        argv=list(argv),
    )


def _nvidia_smi_field(field: str) -> str | None:
    try:
        out = subprocess.run(
            ["nvidia-smi", f"--query-gpu={field}", "--format=csv,noheader"],
            capture_output=True,
            text=True,
            timeout=30,
            check=True,
        )
    except (OSError, subprocess.SubprocessError):
        return None
    lines = out.stdout.strip().splitlines()
    return lines[0].strip() if lines else None


def measure_ceilings(torch: Any, device: Device, timer: Timer) -> Ceilings:
    """A large bf16 matrix product on random data and a large device-to-device copy."""
    n = 8192 if device.type == "cuda" else 512
    a = torch.randn(n, n, device=device, dtype=torch.bfloat16)
    b = torch.randn(n, n, device=device, dtype=torch.bfloat16)
    mm_s = timer.median_s(lambda: torch.matmul(a, b), inner=10)
    nbytes = (2 << 30) if device.type == "cuda" else (64 << 20)
    src = torch.randint(0, 255, (nbytes,), device=device, dtype=torch.uint8)
    dst = torch.empty_like(src)
    copy_s = timer.median_s(lambda: dst.copy_(src), inner=5)
    return Ceilings(
        matmul_tflops=2.0 * n**3 / mm_s / 1e12,
        copy_tbps=2.0 * nbytes / copy_s / 1e12,
        method=(
            f"bf16 {n}x{n}x{n} torch.matmul on random data, and a {nbytes} B device-to-device copy "
            "counting bytes read plus written; CUDA events, median of repeats after warm-up"
        ),
    )


@dataclass(frozen=True)
class AttentionChoice:
    backend: str
    timings: dict[str, str]


def choose_prefill_attention(
    torch: Any, spec: ModelSpec, device: Device, timer: Timer, tokens: int
) -> AttentionChoice:
    """The fastest SDPA backend that computes causal GQA correctly at `tokens`, with all timings.

    vLLM uses FlashAttention 3 on Hopper, which PyTorch does not ship; cuDNN's attention is the
    closest PyTorch has there, FlashAttention 2 the next.
    """
    if device.type != "cuda":
        return AttentionChoice("default", {"default": "cpu: the dispatcher's kernel"})
    from torch.nn.attention import SDPBackend, sdpa_kernel

    shape_q = (1, spec.num_heads, tokens, spec.head_dim)
    shape_kv = (1, spec.num_kv_heads, tokens, spec.head_dim)
    q, k, v = (torch.randn(s, device=device, dtype=torch.bfloat16) for s in (shape_q, shape_kv, shape_kv))
    small = 1024
    ref = reference_attention(torch, q[:, :, :small], k[:, :, :small], v[:, :, :small])
    attend = causal_sdpa(torch)
    timings: dict[str, str] = {}
    best: tuple[float, str] | None = None
    for name in ("CUDNN_ATTENTION", "FLASH_ATTENTION", "EFFICIENT_ATTENTION"):
        backend = getattr(SDPBackend, name, None)
        if backend is None:
            timings[name] = "not in this torch"
            continue
        # A refused backend says why through warnings; keep the reason, not the noise on stderr.
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always", UserWarning)
            try:
                with sdpa_kernel([backend]):
                    err = rel_err(torch, attend(q[:, :, :small], k[:, :, :small], v[:, :, :small]), ref)
                    if not err < 2e-2:
                        timings[name] = f"rejected: relative error {err:.2e} against float64"
                        continue
                    seconds = timer.median_s(lambda: attend(q, k, v))
            except RuntimeError as exc:
                why = [str(w.message).split(" (Triggered")[0] for w in caught][-2:]
                timings[name] = f"unavailable: {str(exc).splitlines()[0][:120]} {why}"
                continue
        timings[name] = f"{seconds * 1e3:.3f} ms at {tokens} tokens, relative error {err:.1e}"
        if best is None or seconds < best[0]:
            best = (seconds, name)
    if best is None:
        raise UserError(f"calibrate: no SDPA backend ran causal grouped-query attention: {timings}")
    log.info("prefill attention: %s (%s)", best[1], timings)
    return AttentionChoice(best[1], timings)


def _sdpa_context(torch: Any, backend: str) -> Any:
    if backend == "default":
        import contextlib

        return contextlib.nullcontext()
    from torch.nn.attention import SDPBackend, sdpa_kernel

    return sdpa_kernel([getattr(SDPBackend, backend)])


def time_head(torch: Any, spec: ModelSpec, device: Device, timer: Timer, batch: int) -> float:
    """Final norm and lm_head for `batch` tokens (logits are computed for the last token of each)."""
    f = torch.nn.functional
    norm = torch.ones(spec.hidden, device=device, dtype=torch.bfloat16)
    head = random_weight(torch, (spec.vocab, spec.hidden), device, spec.hidden**-0.5)
    x = torch.randn(batch, spec.hidden, device=device, dtype=torch.bfloat16)
    return timer.median_s(lambda: f.linear(f.rms_norm(x, (spec.hidden,), norm, 1e-5), head), inner=5)


def measure_prefill(
    torch: Any, spec: ModelSpec, device: Device, timer: Timer, grid: Grids, quick: bool
) -> PrefillResult:
    """Prefill throughput for whole prompts of each context length, batch 1, from one layer's time."""
    choice = choose_prefill_attention(torch, spec, device, timer, min(grid.select_tokens, 16384))
    layer = make_layer(torch, spec, device)
    attend = causal_sdpa(torch)
    head_s = time_head(torch, spec, device, timer, 1)
    points: list[PrefillPoint] = []
    skipped: list[str] = []

    def layer_time(tokens: int) -> float:
        x = torch.randn(tokens, spec.hidden, device=device, dtype=torch.bfloat16)
        rope = rope_tables(torch, torch.arange(tokens, device=device), spec.head_dim)
        shape = (spec.num_kv_heads, tokens, spec.head_dim)
        cache = (
            torch.empty(shape, device=device, dtype=torch.bfloat16),
            torch.empty(shape, device=device, dtype=torch.bfloat16),
        )
        out = prefill_layer(torch, spec, layer, x, rope, cache, attend)
        if not bool(torch.isfinite(out).all()):
            raise UserError(f"calibrate: prefill layer gave non-finite values at {tokens} tokens")
        del out
        return timer.median_s(lambda: prefill_layer(torch, spec, layer, x, rope, cache, attend))

    with _sdpa_context(torch, choice.backend):
        for tokens in grid.prefill_contexts:
            try:
                layer_s = layer_time(tokens)
            except (RuntimeError, MemoryError) as exc:
                if not is_oom(torch, exc):
                    raise
                skipped.append(f"{tokens} tokens: out of device memory")
                log.warning("prefill %d tokens: out of memory, stopping here", tokens)
                break
            finally:
                release(torch, device)
            total = spec.num_layers * layer_s + head_s
            points.append(
                PrefillPoint(
                    context_tokens=tokens,
                    layer_s=layer_s,
                    head_s=head_s,
                    total_s=total,
                    tokens_per_s=tokens / total,
                    layer_tflops=spec.layer_prefill_flops(tokens) / layer_s / 1e12,
                    runs=timer.repeats,
                )
            )
            log.info("prefill %6d tokens: %.4f s, %.0f tok/s", tokens, total, tokens / total)
        checks = _full_model_checks(torch, spec, device, timer, grid, points, layer, skipped)
    return PrefillResult(
        method=(
            "one decoder layer (fused QKV, RMSNorm, rotary, causal GQA through "
            f"scaled_dot_product_attention [{choice.backend}], KV-cache write, gated MLP) over a whole "
            f"prompt of random bf16 data, batch 1; total = num_layers * layer + final norm and lm_head "
            f"for the last token; {timer.clock}, median of {timer.repeats} runs after {timer.warmup} "
            f"warm-up{' (--quick)' if quick else ''}; attention backends tried: {choice.timings}"
        ),
        attention_backend=choice.backend,
        points=points,
        skipped=skipped,
        full_model_checks=checks,
    )


def _full_model_checks(
    torch: Any,
    spec: ModelSpec,
    device: Device,
    timer: Timer,
    grid: Grids,
    points: list[PrefillPoint],
    layer: LayerWeights,
    skipped: list[str],
) -> list[FullModelCheck]:
    """Time a whole stack of distinct layers where it fits, against num_layers * one layer."""
    free = torch.cuda.mem_get_info(device)[0] if device.type == "cuda" else 1 << 40
    if spec.weights_bytes() > 0.6 * free:
        skipped.append(
            f"full-model check: {spec.weights_bytes() / 2**30:.1f} GiB of weights do not fit beside "
            f"the activations in {free / 2**30:.1f} GiB free; figures rest on per-layer scaling alone"
        )
        return []
    by_tokens = {p.context_tokens: p for p in points}
    layers = [make_layer(torch, spec, device) for _ in range(spec.num_layers)]
    attend = causal_sdpa(torch)
    checks: list[FullModelCheck] = []
    for tokens in grid.full_model_contexts:
        if tokens not in by_tokens:
            continue
        x = torch.randn(tokens, spec.hidden, device=device, dtype=torch.bfloat16)
        rope = rope_tables(torch, torch.arange(tokens, device=device), spec.head_dim)
        caches = [
            tuple(
                torch.empty(spec.num_kv_heads, tokens, spec.head_dim, device=device, dtype=torch.bfloat16)
                for _ in range(2)
            )
            for _ in layers
        ]

        def stack(x: Tensor = x, rope: Any = rope, caches: Any = caches, layers: Any = layers) -> Tensor:
            for w, c in zip(layers, caches, strict=True):
                x = prefill_layer(torch, spec, w, x, rope, (c[0], c[1]), attend)
            return x

        if not bool(torch.isfinite(stack()).all()):
            raise UserError(f"calibrate: the full {spec.num_layers}-layer stack gave non-finite values")
        full_s = timer.median_s(stack)
        scaled = spec.num_layers * by_tokens[tokens].layer_s
        checks.append(
            FullModelCheck(context_tokens=tokens, full_s=full_s, scaled_s=scaled, ratio=full_s / scaled)
        )
        log.info("full-model check %d tokens: full %.4f s vs scaled %.4f s", tokens, full_s, scaled)
        del x, rope, caches
        release(torch, device)
    del layers
    release(torch, device)
    return checks


def decode_grid(spec: ModelSpec, grid: Grids, device_memory: int) -> list[tuple[int, int, bool]]:
    """(batch, context, fits) points whose KV fits beside the weights (or, where the weights alone
    overflow the device, at most 256K tokens of KV in total)."""
    budget = MEMORY_FRACTION * device_memory - spec.weights_bytes() if device_memory else float("inf")
    max_tokens = budget / spec.kv_bytes_per_token() if budget > 0 else 262144.0
    out: list[tuple[int, int, bool]] = []
    for batch in grid.decode_batches:
        for context in grid.decode_contexts:
            if batch * context <= max_tokens:
                out.append((batch, context, budget > 0))
    return out


def measure_decode(
    torch: Any, spec: ModelSpec, device: Device, timer: Timer, grid: Grids, device_memory: int
) -> DecodeResult:
    """Decode step time over a (batch, context) grid, the faster of two attention implementations."""
    layer = make_layer(torch, spec, device)
    impls = ("sdpa", "matmul")
    _check_decode_attention(torch, spec, device)
    points: list[DecodePoint] = []
    skipped: list[str] = []
    heads: dict[int, float] = {}
    for batch, context, fits in decode_grid(spec, grid, device_memory):
        if batch not in heads:
            heads[batch] = time_head(torch, spec, device, timer, batch)
        try:
            best = _decode_point(torch, spec, device, timer, grid, layer, batch, context, impls)
        except (RuntimeError, MemoryError) as exc:
            if not is_oom(torch, exc):
                raise
            skipped.append(f"batch {batch} x {context} tokens: out of device memory")
            log.warning("decode b=%d c=%d: out of memory, skipped", batch, context)
            continue
        finally:
            release(torch, device)
        layer_s, impl, graphed = best
        step_s = spec.num_layers * layer_s + heads[batch]
        nbytes = spec.num_layers * spec.layer_decode_bytes(batch, context) + spec.head_bytes()
        points.append(
            DecodePoint(
                batch=batch,
                context_tokens=context,
                layer_s=layer_s,
                head_s=heads[batch],
                step_s=step_s,
                achieved_tbps=nbytes / step_s / 1e12,
                attention_impl=impl,
                graphed=graphed,
                fits_one_device=fits,
            )
        )
        log.info("decode b=%3d c=%6d: %.3f ms/step (%s)", batch, context, step_s * 1e3, impl)
    return DecodeResult(
        method=(
            "one decoder layer's decode step (batch x 1 new token over batch x context cached tokens of "
            "random bf16 KV, contiguous per sequence), captured as a CUDA graph and timed over "
            f"{grid.decode_replays} replays with {timer.clock}, median of {timer.repeats} after "
            f"{timer.warmup} warm-up; the "
            f"faster of attention implementations {list(impls)} per point; step = num_layers * layer + "
            "final norm and lm_head for the batch; sampling and scheduling are not included"
        ),
        points=points,
        skipped=skipped,
    )


def _decode_point(
    torch: Any,
    spec: ModelSpec,
    device: Device,
    timer: Timer,
    grid: Grids,
    layer: LayerWeights,
    batch: int,
    context: int,
    impls: Sequence[str],
) -> tuple[float, str, bool]:
    """(seconds, implementation, graphed) of the fastest implementation of one layer's decode step."""
    x = torch.randn(batch, spec.hidden, device=device, dtype=torch.bfloat16)
    rope = rope_tables(torch, torch.tensor([context - 1], device=device), spec.head_dim)
    shape = (batch, spec.num_kv_heads, context, spec.head_dim)
    cache = (
        torch.randn(shape, device=device, dtype=torch.bfloat16),
        torch.randn(shape, device=device, dtype=torch.bfloat16),
    )
    best: tuple[float, str, bool] | None = None
    for impl in impls:
        attend = decode_attention(torch, impl)

        def step(attend: Attention = attend) -> object:
            return decode_layer(torch, spec, layer, x, rope, cache, attend)

        try:
            run, graph = graphed(torch, device, step)
        except RuntimeError as exc:
            if is_oom(torch, exc):
                raise
            log.warning(
                "decode %s b=%d c=%d: graph capture failed (%s); timing eagerly", impl, batch, context, exc
            )
            run, graph = step, None
        seconds = timer.median_s(run, inner=grid.decode_replays)
        if best is None or seconds < best[0]:
            best = (seconds, impl, graph is not None)
        del run, graph
    if best is None:
        raise UserError("calibrate: no decode attention implementation to time")
    return best


def _check_decode_attention(torch: Any, spec: ModelSpec, device: Device) -> None:
    """Both decode attention implementations against float64 on fresh random data (METHOD.md)."""
    group = spec.num_heads // spec.num_kv_heads
    q = torch.randn(2, spec.num_kv_heads, group, spec.head_dim, device=device, dtype=torch.bfloat16)
    k = torch.randn(2, spec.num_kv_heads, 300, spec.head_dim, device=device, dtype=torch.bfloat16)
    v = torch.randn_like(k)
    scores = torch.matmul(q.double(), k.double().transpose(-1, -2)) / math.sqrt(spec.head_dim)
    ref = torch.matmul(scores.softmax(dim=-1), v.double())
    for impl in ("sdpa", "matmul"):
        err = rel_err(torch, decode_attention(torch, impl)(q, k, v), ref)
        if not err < 2e-2:
            raise UserError(f"calibrate: decode attention '{impl}' is wrong: relative error {err:.2e}")


def measure_transfer(torch: Any, spec: ModelSpec, device: Device, timer: Timer) -> TransferResult:
    """Pinned host <-> device copies of one layer's slice of a 256-token chunk, a chunk, and 8 chunks."""
    chunk = CHUNK_TOKENS * spec.kv_bytes_per_token()
    sizes = (CHUNK_TOKENS * spec.kv_bytes_per_token_per_layer(), chunk, 8 * chunk)
    pinned = device.type == "cuda"
    points: list[TransferPoint] = []
    for nbytes in sizes:
        host = torch.randint(0, 255, (nbytes,), dtype=torch.uint8).pin_memory() if pinned else None
        if host is None:
            host = torch.randint(0, 255, (nbytes,), dtype=torch.uint8)
        dev = torch.empty(nbytes, dtype=torch.uint8, device=device)

        def load(dev: Tensor = dev, host: Tensor = host) -> object:
            return dev.copy_(host, non_blocking=True)

        def store(dev: Tensor = dev, host: Tensor = host) -> object:
            return host.copy_(dev, non_blocking=True)

        h2d = timer.median_s(load, inner=8)
        d2h = timer.median_s(store, inner=8)
        points.append(TransferPoint(direction="h2d", nbytes=nbytes, seconds=h2d, gbps=nbytes / h2d / 1e9))
        points.append(TransferPoint(direction="d2h", nbytes=nbytes, seconds=d2h, gbps=nbytes / d2h / 1e9))
        log.info("copy %d B: h2d %.1f GB/s, d2h %.1f GB/s", nbytes, nbytes / h2d / 1e9, nbytes / d2h / 1e9)
    release(torch, device)
    return transfer_result(points, chunk, pinned, timer.clock)


def transfer_result(
    points: list[TransferPoint], chunk: int, pinned: bool = True, clock: str = "CUDA events"
) -> TransferResult:
    """Bandwidth from the largest copies; per-chunk overhead = a chunk's time beyond size/bandwidth."""
    by_dir = {
        d: sorted((p for p in points if p.direction == d), key=lambda p: p.nbytes) for d in ("h2d", "d2h")
    }
    if not by_dir["h2d"] or not by_dir["d2h"]:
        raise UserError("calibrate: transfer points need both h2d and d2h copies")
    bw = {d: by_dir[d][-1].gbps for d in by_dir}
    overheads = [
        max(0.0, p.seconds - p.nbytes / (bw[p.direction] * 1e9))
        for d in by_dir
        for p in by_dir[d]
        if p.nbytes == chunk
    ]
    return TransferResult(
        method=(
            f"{'pinned' if pinned else 'pageable'} host buffer <-> device buffer, copy_(non_blocking=True), "
            f"8 back-to-back copies per timed run, {clock}, median of runs; bandwidth from the largest "
            "size, per-chunk overhead = one 256-token chunk's time beyond size / bandwidth. Contiguous "
            "copies: the gather from paged KV blocks that LMCache also does is not included"
        ),
        chunk_tokens=CHUNK_TOKENS,
        chunk_bytes=chunk,
        points=points,
        host_to_device_gbps=bw["h2d"],
        device_to_host_gbps=bw["d2h"],
        per_chunk_overhead_s=statistics.median(overheads) if overheads else 0.0,
    )


@dataclass(frozen=True)
class GpuResults:
    environment: Environment
    ceilings: Ceilings
    prefill: PrefillResult
    decode: DecodeResult
    transfer: TransferResult


def measure_gpu(
    spec: ModelSpec, device_type: str, quick: bool, started_at: str, argv: Sequence[str]
) -> GpuResults:
    """Every device-side measurement for `spec`, in the order cheapest first."""
    torch = import_torch()
    if device_type == "cuda" and not torch.cuda.is_available():
        raise UserError(
            "calibrate: torch sees no CUDA device; run on the GPU host (or --device cpu for a smoke test)"
        )
    device = torch.device(device_type)
    torch.manual_seed(0)
    grid = grids(device_type, quick)
    env = environment(torch, device, started_at, argv)
    log.info("calibrating %s on %s (torch %s, driver %s)", spec.name, env.device_name, env.torch, env.driver)
    timer = Timer(torch, device, grid.warmup, grid.repeats)
    with torch.inference_mode():
        ceilings = measure_ceilings(torch, device, timer)
        log.info("ceilings: %.0f TFLOP/s bf16, %.2f TB/s copy", ceilings.matmul_tflops, ceilings.copy_tbps)
        transfer = measure_transfer(torch, spec, device, timer)
        prefill = measure_prefill(torch, spec, device, timer, grid, quick)
        decode = measure_decode(torch, spec, device, timer, grid, env.device_memory_bytes)
    return GpuResults(env, ceilings, prefill, decode, transfer)
