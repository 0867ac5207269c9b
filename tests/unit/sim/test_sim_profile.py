"""Cost profiles: every shipped profile loads, the interpolation and fits behave, bad files are refused."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from kvoffload.errors import UserError
from kvoffload.sim.profile import PROFILE_DIR, Decode, Prefill, load_profile, shipped_profiles

SHIPPED = shipped_profiles()
STARTS_AT_ONCE = {"tiny", "h200-llama-8b", "h200-qwen3-8b", "h200-qwen3-32b", "h200-llama-70b"}


def test_required_profiles_are_shipped() -> None:
    assert {"tiny", "h100-llama-8b", "h200-llama-8b-cited", "mi300x-llama-8b"} <= set(SHIPPED)


@pytest.mark.parametrize("name", SHIPPED)
def test_shipped_profile_loads_and_names_itself(name: str) -> None:
    p = load_profile(name)
    assert p.name == name
    for group in ("hardware", "model", "prefill", "decode", "transfer", "disk"):
        assert getattr(p.provenance, group).source
    # A start-up time is always sourced; the hand-written real-device profiles state one (so a restart
    # costs what it would there); tiny (tests, demo) and the calibrated ones (calibrate does not
    # measure start-up) start at once.
    if name in STARTS_AT_ONCE:
        assert p.startup.total_s == 0 and p.provenance.startup is None
    else:
        assert p.startup.model_load_s > 0 and p.startup.graph_capture_s > 0
        assert p.provenance.startup is not None and p.provenance.startup.method


def test_prefill_interpolates_and_charges_attention_on_cached_prefix() -> None:
    pre = Prefill.model_validate_json('{"points": [[1000, 10000], [3000, 5000]]}')
    assert pre.tokens_per_s(500) == 10000
    assert pre.tokens_per_s(2000) == 7500
    assert pre.tokens_per_s(9000) == 5000
    assert pre.cumulative_s(3000) == pytest.approx(0.6)
    # The last 1000 tokens after a 2000-token hit cost more than the first 1000 from scratch.
    assert pre.seconds(2000, 3000) > pre.seconds(0, 1000)
    assert pre.seconds(0, 3000) == pytest.approx(pre.seconds(0, 2000) + pre.seconds(2000, 3000))


def test_prefill_refuses_a_longer_prompt_that_is_faster() -> None:
    with pytest.raises(ValueError, match="must not fall"):
        Prefill.model_validate_json('{"points": [[1000, 1000], [2000, 4000]]}')


def test_decode_points_are_fitted_to_the_linear_form() -> None:
    truth = (0.005, 0.0001, 4e-8)
    pts = [[b, c, truth[0] + truth[1] * b + truth[2] * b * c] for b in (1, 8, 64) for c in (500, 4000)]
    form = Decode.model_validate_json(f'{{"points": {pts}}}').form()
    assert form.base_s == pytest.approx(truth[0], rel=1e-6)
    assert form.per_seq_s == pytest.approx(truth[1], rel=1e-6)
    assert form.per_context_token_s == pytest.approx(truth[2], rel=1e-6)


def test_decode_needs_exactly_one_form() -> None:
    with pytest.raises(ValueError, match="exactly one"):
        Decode.model_validate_json("{}")


def _write(tmp_path: Path, mutate: dict[str, object]) -> Path:
    data = yaml.safe_load((PROFILE_DIR / "tiny.yaml").read_text())
    data.update(mutate)
    path = tmp_path / "p.yaml"
    path.write_text(yaml.safe_dump(data))
    return path


def test_unknown_key_is_refused_with_the_file_named(tmp_path: Path) -> None:
    path = _write(tmp_path, {"colour": "blue"})
    with pytest.raises(UserError, match=r"p\.yaml.*colour"):
        load_profile(str(path))


def test_kv_bytes_must_match_the_shape(tmp_path: Path) -> None:
    model = dict(load_profile("tiny").model.model_dump())
    model["kv_bytes_per_token"] = 1234
    with pytest.raises(UserError, match="kv_bytes_per_token"):
        load_profile(str(_write(tmp_path, {"model": model})))


def test_unknown_profile_name_lists_the_shipped_ones() -> None:
    with pytest.raises(UserError, match="tiny"):
        load_profile("no-such-profile")


def test_a_startup_time_needs_its_source(tmp_path: Path) -> None:
    with pytest.raises(UserError, match=r"provenance\.startup is missing"):
        load_profile(str(_write(tmp_path, {"startup": {"model_load_s": 30}})))
    prov = dict(load_profile("tiny").provenance.model_dump(exclude_none=True))
    prov["startup"] = {
        "source": "measured",
        "method": "vLLM log",
        "device": "NVIDIA H200",
        "date": "2026-12-01",
    }
    p = load_profile(str(_write(tmp_path, {"startup": {"model_load_s": 30}, "provenance": prov})))
    assert (p.startup.model_load_s, p.startup.graph_capture_s, p.startup.total_s) == (30.0, 0.0, 30.0)
    with pytest.raises(UserError, match=r"startup\.model_load_s"):
        load_profile(str(_write(tmp_path, {"startup": {"model_load_s": -1}, "provenance": prov})))
