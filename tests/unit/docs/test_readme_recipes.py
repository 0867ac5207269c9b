"""README's recipes (issue 45): each parses, each `kvoffload-lab` command in them is one the CLI takes,
flag for flag, and the recipes that need no lab run here on the recorded fixture campaign.

The recipe that needs a lab ("Your campaign on the virtual lab") runs end to end in the lab lane
(tests/lab/test_readme_recipe.py); here its campaign is validated and its dataset loaded.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shlex
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from kvoffload.cli.main import build_parser, main
from kvoffload.config import campaign_dataset_path, load_lab
from kvoffload.orchestrate.campaign import runner as campaign_module
from kvoffload.orchestrate.checks.controller import campaign_where, load_campaign_dataset
from kvoffload.orchestrate.installs import host_python, wheelhouse
from kvoffload.orchestrate.installs.wheelhouse import Wheels
from tests.support.datasets import generic_lines
from tests.support.readme_recipes import ROOT, Recipe, cli_argv, expand, recipes, redirect_target

FIXTURE = ROOT / "tests" / "fixtures" / "campaign-small"
EXAMPLE = ROOT / "inventories" / "example" / "hosts.yml"
SHELL = {"HOME": "/root", "PWD": str(ROOT)}  # the variables of the reader's shell the recipes read
NAMES = ["virtual-lab-campaign", "your-own-lab", "plain-ansible-cell", "compare-campaigns", "read-the-report"]


def _defaults(recipe: Recipe) -> dict[str, str]:
    """The recipe's placeholders at README's values, as the reader's shell would expand them."""
    values = dict(SHELL)
    for name, value in recipe.placeholders().items():
        values[name] = expand(value, values)
    return values


def _subparser(argv: list[str]) -> argparse.ArgumentParser:
    """The parser of the deepest sub-command `argv` names (`lab up`, `datasets inspect`, `plan`)."""
    parser = build_parser()
    for word in argv:
        subs = [a for a in parser._actions if isinstance(a, argparse._SubParsersAction)]
        if not subs or word not in subs[0].choices:
            break
        parser = subs[0].choices[word]
    return parser


def flag_problems(argv: list[str]) -> list[str]:
    """What the CLI does not take in `kvoffload-lab ARGV`: a flag its sub-command lacks, spelled exactly
    (argparse would take an abbreviation, so a renamed flag could still parse), or a parse error."""
    parser = _subparser(argv)
    problems = [
        f"{parser.prog}: no flag {word.split('=')[0]}"
        for word in argv
        if word.startswith("-") and word.split("=")[0] not in parser._option_string_actions
    ]
    try:
        build_parser().parse_args(argv)
    except SystemExit:
        problems.append(f"kvoffload-lab {shlex.join(argv)}: does not parse")
    return problems


def _fixture_campaign(dest: Path) -> Path:
    """The recorded five-cell campaign with a latency target, example prices and a dataset digest (what
    a run writes), so that its report has a decision table and two copies of it compare."""
    shutil.copytree(FIXTURE, dest, ignore=shutil.ignore_patterns("tables", "report", "*.py", "*.md"))
    doc = json.loads((dest / "campaign.json").read_text())
    # its cells hold 8 later-round requests each: the slo's min_window_requests says that is enough
    slo = {"ttft_p95_s": 0.15, "min_window_requests": 8}
    doc["campaign"] = {"slo": slo, "prices": {"node_hour": 10.0, "example": True}}
    doc["dataset"] = {"code": "generic", "digest": "sha256:0"}
    (dest / "campaign.json").write_text(json.dumps(doc))
    return dest


def _bash(recipe: Recipe, values: dict[str, str], cwd: Path) -> subprocess.CompletedProcess[str]:
    """The recipe run as README shows it, by bash, with this venv's `kvoffload-lab` on the PATH."""
    env = {**os.environ, "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}"}
    return subprocess.run(["bash", "-euo", "pipefail", "-c", recipe.script(values)], cwd=cwd, env=env,
                          capture_output=True, text=True, timeout=300, check=False)  # fmt: skip


def test_readme_has_its_recipes_each_with_its_placeholders_set_before_use() -> None:
    found = recipes()
    assert list(found) == NAMES
    for recipe in found.values():
        commands = recipe.commands()
        assert any(c.startswith("kvoffload-lab ") for c in commands), recipe.name
        unset = recipe.variables_used() - set(recipe.placeholders()) - set(SHELL)
        assert not unset, (recipe.name, unset)


def test_every_kvoffload_lab_command_of_every_recipe_is_one_the_cli_takes() -> None:
    seen = set()
    for recipe in recipes().values():
        for command in recipe.commands():
            argv = cli_argv(command, _defaults(recipe))
            if argv is None:
                continue
            assert flag_problems(argv) == [], (recipe.name, command)
            seen.add(_subparser(argv).prog)
    used = {"lab up", "plan", "run", "doctor", "compare", "report", "datasets inspect"}
    assert {f"kvoffload-lab {name}" for name in used} <= seen


def test_the_flag_check_catches_a_renamed_flag_and_an_abbreviation() -> None:
    assert flag_problems(["compare", "--decision", "a", "b"]) == []
    assert flag_problems(["compare", "--decisions", "a", "b"]) != []
    # argparse itself takes `--decis` for `--decision`: the check does not
    assert flag_problems(["compare", "--decis", "a", "b"]) == ["kvoffload-lab compare: no flag --decis"]
    assert flag_problems(["lab", "up", "--clients", "2", "--nodes", "2"]) == []
    assert flag_problems(["lab", "up", "--client", "2"]) == ["kvoffload-lab lab up: no flag --client"]


def test_the_virtual_lab_recipe_writes_a_valid_campaign_on_a_dataset_that_loads(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    recipe = recipes()["virtual-lab-campaign"]
    values = {**_defaults(recipe), "WORK": str(tmp_path)}
    [inspect] = [c for c in recipe.commands() if c.startswith("kvoffload-lab datasets inspect")]
    assert main(cli_argv(inspect, values)) == 0
    assert "virtual users" in capsys.readouterr().out
    [write] = [c for c in recipe.commands() if c.startswith("cat > ")]
    campaign_file = Path(expand(shlex.split(write.splitlines()[0])[2], values))
    campaign_file.write_text(expand(recipe.heredoc(write), values))
    # validated with an inventory, as `plan` does (the example's: two nodes, simulator-ready)
    lab = load_lab(EXAMPLE, campaign_file)
    campaign = lab.campaign
    assert campaign.name == "mine" and campaign.engine == "sim" and campaign.slo is not None
    assert sorted((c.tier, c.concurrency) for c in lab.cells) == [
        ("cpu", 2),
        ("cpu", 8),
        ("gpu", 2),
        ("gpu", 8),
    ]
    sessions = load_campaign_dataset(
        campaign, campaign_dataset_path(campaign, campaign_file), campaign_where(campaign_file, "")
    )
    assert len(sessions) >= campaign.max_sessions
    # every later command reads the files the recipe wrote
    for command in recipe.commands():
        argv = cli_argv(command, values)
        if argv and argv[0] in ("plan", "run"):
            assert argv[argv.index("--campaign") + 1] == str(campaign_file)


@pytest.fixture
def no_wheels_no_hosts(monkeypatch: pytest.MonkeyPatch) -> None:
    """`plan --emit-extravars` without building wheels or asking hosts (a unit test has neither)."""

    def fake(cache: Path, **_kwargs: object) -> Wheels:
        return Wheels(package=cache / "p" / "kvoffload_lab-0-py3-none-any.whl", wheelhouse=cache / "h.tar")

    monkeypatch.setattr(wheelhouse, "build_wheels", fake)
    monkeypatch.setattr(campaign_module, "build_wheels", fake)
    monkeypatch.setattr(host_python, "learn_hosts_python", lambda _runner: "3.11.2")


def test_the_plain_ansible_recipe_runs_what_emit_extravars_says(
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
    no_wheels_no_hosts: None,
) -> None:
    recipe = recipes()["plain-ansible-cell"]
    (tmp_path / "calls.jsonl").write_text("\n".join(generic_lines(3, 10)) + "\n")
    campaign = {"name": "plain", "model": "m", "gpu_vendor": "nvidia", "engine": "sim", "sim_profile": "tiny",
                "dataset": {"code": "generic", "path": str(tmp_path / "calls.jsonl")},
                "tiers": ["gpu", "cpu"], "concurrency": [2], "num_rounds": [5], "isl": 4096}  # fmt: skip
    (tmp_path / "campaign.yml").write_text(yaml.safe_dump(campaign))
    monkeypatch.chdir(tmp_path)
    cell = load_lab(EXAMPLE, tmp_path / "campaign.yml").cells[0].id
    values = {**_defaults(recipe), "INV": str(EXAMPLE), "CAMPAIGN": "campaign.yml", "CELL": cell}
    emit, head, playbook, finish = recipe.commands()
    assert main(cli_argv(emit, values)) == 0
    Path(redirect_target(emit, values) or "").write_text(capsys.readouterr().out)
    shown = subprocess.run(
        shlex.split(expand(head, values), comments=True), capture_output=True, text=True, check=True
    )
    header = [line.removeprefix("#   ") for line in shown.stdout.splitlines()]
    assert header[0].startswith(f"# kvoffload-lab extravars of cell {cell} on node ")
    # the recipe's ansible-playbook line is the one the header gives, its --limit the cell's hosts
    told = shlex.split(header[1].replace("@THIS_FILE", "@cell.yml"))
    limit = told[told.index("--limit") + 1]
    assert shlex.split(expand(playbook, {**values, "LIMIT": limit}), comments=True) == told
    assert limit.count(",") == 1 and limit.endswith(".lab.example")
    assert yaml.safe_load(Path("cell.yml").read_text())  # the extravars, as ansible-playbook reads them
    # and its --finish-cell line means what the header's does
    mine, theirs = (
        {k: v for k, v in vars(build_parser().parse_args(argv)).items() if k != "func"}
        for argv in (cli_argv(finish, values), shlex.split(header[3])[1:])
    )
    assert mine == theirs and mine["finish_cell"] == cell


def test_the_compare_recipe_puts_two_recorded_campaigns_side_by_side(tmp_path: Path) -> None:
    recipe = recipes()["compare-campaigns"]
    a, b = _fixture_campaign(tmp_path / "lab-a"), _fixture_campaign(tmp_path / "lab-b")
    done = _bash(recipe, {"A": str(a), "B": str(b)}, tmp_path)
    assert done.returncode == 0, done.stderr[-3000:]
    decision, _, cells = done.stdout.partition("cell (tier model c rounds isl osl repeat)")
    # cpu at least 2 sessions at p95 <= 0.15 s (its level 3 was not held) in both campaigns' columns
    assert decision.count(">= 2 sessions, <= 150 USD/1M (example prices); more sessions") == 2
    assert "lab-a" in decision and "lab-b" in decision
    # then the matching cells, figure by figure: a copy of a campaign changes nothing
    rows = [[f.strip() for f in line.split("│")[1:-1]] for line in cells.splitlines() if line.startswith("│")]
    cpu = [r for r in rows if r[0] == "cpu tiny 2 3 8192 32 0"]
    assert [r[1] for r in cpu] == ["ttft_p50_s", "ttft_p95_s"]
    assert all(r[2] == r[3] and float(r[4]) == 0.0 for r in cpu), cpu


def test_the_report_recipe_shows_the_decision_then_findings_then_validity(tmp_path: Path) -> None:
    recipe = recipes()["read-the-report"]
    campaign = _fixture_campaign(tmp_path / "recorded")
    done = _bash(recipe, {"R": str(campaign)}, tmp_path)
    assert done.returncode == 0, done.stderr[-3000:]
    out = done.stdout
    decision, findings, validity = (out.index(h) for h in
                                    ("## Which tier", "## Findings", "## Validity warnings"))  # fmt: skip
    assert decision < findings < validity
    assert "| cpu | >= 2 (level 3 was not held: cell b2cpu: never 3 sessions live" in out[decision:findings]
    assert "### tiny c=8 rounds=3 isl=8192 osl=32" in out[findings:validity]
    assert "**cell_not_done** [b1gpu]" in out[validity:]  # the interrupted cell (fixture README)
    assert "## Capacity" not in out  # each range stops at the next section
    rows = (tmp_path / "decision.csv").read_text().splitlines()
    assert rows[0].startswith("model,num_rounds,isl,osl,tier,")
    assert any(r.startswith("tiny,3,8192,32,cpu,") and ",at_least,2.0,>=," in r for r in rows), rows


def test_every_doc_readme_points_to_exists_and_the_sections_others_cite_are_headings() -> None:
    text = (ROOT / "README.md").read_text()
    docs = set(re.findall(r"\bdocs/[a-z_]+\.md\b", text))
    assert {"docs/benchmarks.md", "docs/inventory.md", "docs/campaign.md", "docs/metrics.md"} <= docs
    assert {"docs/reference.md"} <= docs
    assert [d for d in sorted(docs) if not (ROOT / d).is_file()] == []
    text += (ROOT / "docs" / "reference.md").read_text()  # the manual's reference part
    headings = {line.lstrip("#").strip() for line in text.splitlines() if line.startswith("#")}
    # cited by name: the engine pins' errors, the host checks, the Makefile, "What is not exercised here"
    cited = ["Known-good engine sets", "Supported hosts", "Tests", "What is not exercised here",
             "Using it on a real lab"]  # fmt: skip
    assert [c for c in cited if c not in headings] == []
