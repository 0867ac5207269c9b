"""Guards of `lab up`/`down` that need no root: clear refusals, option checks."""

from __future__ import annotations

import pytest

from kvoffload.cli.main import main
from kvoffload.lab import lifecycle


def test_non_root_is_refused_with_a_clear_message(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setattr(lifecycle.os, "geteuid", lambda: 1000)
    assert main(["lab", "down"]) == 2
    assert "the virtual lab needs root" in capsys.readouterr().err


@pytest.mark.parametrize(
    ("options", "words"),
    [
        (lifecycle.UpOptions(hosts=0), "--hosts 0"),
        (lifecycle.UpOptions(prefix="kv-lab"), "--prefix kv-lab"),
        (lifecycle.UpOptions(prefix="averylongprefix"), "--prefix averylongprefix"),
        (lifecycle.UpOptions(bridge="a-very-long-bridge"), "--bridge 'a-very-long-bridge'"),
        (lifecycle.UpOptions(bridge="br 0"), "--bridge 'br 0'"),
    ],
)
def test_bad_options(options: lifecycle.UpOptions, words: str) -> None:
    with pytest.raises(lifecycle.UserError, match=words):
        lifecycle.check_options(options)
