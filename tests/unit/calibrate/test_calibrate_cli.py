"""`kvoffload-lab calibrate` argument handling and the --from-raw path, through the real CLI entry."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from kvoffload.cli.main import main
from kvoffload.sim.profile import load_profile


def _from_raw(shape: str, raw: Path, out: Path, *extra: str) -> int:
    """`kvoffload-lab calibrate --from-raw`: the profile of shape `shape` from a raw run's JSON."""
    return main(["calibrate", "--model-shape", shape, "--from-raw", str(raw), "--output", str(out), *extra])


def test_from_raw_writes_a_loadable_profile(
    tmp_path: Path, raw_llama8b_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "h200.yaml"
    assert _from_raw("llama-8b", raw_llama8b_path, out) == 0
    assert load_profile(str(out)).name == "h200"
    printed = capsys.readouterr().out
    assert f"wrote {out} (NVIDIA H200, llama-8b)" in printed
    assert "131072: 11722" in printed


def test_name_flag_overrides_the_file_stem(tmp_path: Path, raw_llama8b_path: Path) -> None:
    out = tmp_path / "x.yaml"
    assert _from_raw("llama-8b", raw_llama8b_path, out, "--name", "lab-h200") == 0
    assert load_profile(str(out)).name == "lab-h200"


def test_from_raw_of_another_shape_is_refused(
    tmp_path: Path, raw_llama8b_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "p.yaml"
    assert _from_raw("qwen3-8b", raw_llama8b_path, out) == 2
    assert "holds shape llama-8b, not --model-shape qwen3-8b" in capsys.readouterr().err
    assert not out.exists()


def test_output_must_be_yaml(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    rc = main(["calibrate", "--model-shape", "llama-8b", "--output", str(tmp_path / "p.json")])
    assert rc == 2
    assert "--output" in capsys.readouterr().err


def test_unknown_shape_is_an_argparse_error(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exc:
        main(["calibrate", "--model-shape", "gpt-5", "--output", str(tmp_path / "p.yaml")])
    assert exc.value.code == 2
    assert "invalid choice: 'gpt-5'" in capsys.readouterr().err


def test_bad_disk_size_is_an_argparse_error(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit):
        main(
            [
                "calibrate",
                "--model-shape",
                "tiny",
                "--output",
                str(tmp_path / "p.yaml"),
                "--disk-bytes",
                "lots",
            ]
        )
    assert "'lots' is not a size" in capsys.readouterr().err


def test_measuring_without_torch_says_how_to_get_it(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setitem(sys.modules, "torch", None)  # `import torch` fails, as where it is not installed
    rc = main(["calibrate", "--model-shape", "tiny", "--device", "cpu", "--output", str(tmp_path / "p.yaml")])
    assert rc == 2
    assert "PyTorch is not installed" in capsys.readouterr().err
    assert not (tmp_path / "p.yaml").exists()
