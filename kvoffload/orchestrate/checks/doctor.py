"""Running the doctor on a lab: the probe on every host (playbooks/doctor.yml), then the controller's
checks and a verdict per host.

What each host is asked follows from the inventory and the campaign: the L1 size its lmcache-server
will pin (the largest of the campaign's cells there), its L2 folder (nvme tier), the engine venv. `run`
calls `cheap_gate` after provisioning: the probe without its CUDA children, engine import or a long
L2 probe, and a `UserError` naming the host, the check and the fix when one fails. `doctor` then hands
the nodes with a vLLM/LMCache pair to the smoke check (orchestrate/checks/round_trip.py), whose facts the
pair's
check judges (doctor/smoke.py), and to the cell-free pair check (orchestrate/checks/cellfree.py: LMCache's
server and bench as two sandboxed units, no model; judged by doctor/pair_cellfree.py). Prints nothing.
"""

from __future__ import annotations

import json
import shutil
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

from kvoffload.doctor import checks as dc
from kvoffload.doctor import pair_cellfree as dp
from kvoffload.doctor.jit import ALLREDUCE_ENV, SAMPLER_ENV, flashinfer_jit
from kvoffload.doctor.verdict import Check
from kvoffload.engines.lab import host_build
from kvoffload.errors import UserError
from kvoffload.orchestrate.cell.deployment import REMOTE_VENV
from kvoffload.orchestrate.playbooks_api import DOCTOR, Runner, fetch_answers
from kvoffload.parallelism import tensor_parallel_size

if TYPE_CHECKING:
    from kvoffload.config import LabConfig
    from kvoffload.config.cells import Cell

PLAYBOOK = DOCTOR  # playbooks_api names it
# In a campaign's results folder: `doctor`'s record and the probes' answers; `run`'s cheap checks
# keep theirs apart (RUN_DOCTOR_DIR/doctor.json), so a full doctor's record is never overwritten.
DOCTOR_JSON = "doctor.json"
DOCTOR_DIR = "doctor"
RUN_DOCTOR_DIR = "doctor-run"
# in DOCTOR_DIR: what the smoke check's round trip collected on each node
# (orchestrate/checks/round_trip.py), and
# the cell-free pair check's node answers (orchestrate/checks/cellfree.py)
SMOKE_JSON = "smoke.json"
PAIR_JSON = "pair_cellfree.json"
PROBE = Path(__file__).resolve().parents[2] / "doctor" / "probe.py"
# `run`'s cheap checks: no CUDA children (seconds to a minute per GPU host), no import of the engine
# packages (tens of seconds), a 4 MiB L2 probe
CHEAP_ARGS = ("--no-cuda", "--no-engine", "--io-mb", "4")


@dataclass(frozen=True)
class HostAsk:
    """What the probe is asked on one host."""

    l1_gb: float | None = None
    l2_path: str | None = None
    lmcache: bool = False
    engine_build: str | None = None  # the vLLM build its engine venv holds (vllm hosts of a vllm campaign)
    # (tier, VLLM_USE_FLASHINFER_SAMPLER in that tier's engine profile, None: unset) for the tiers its
    # replicas run (vllm hosts of a vllm campaign): the flashinfer_jit check (doctor/jit.py)
    sampler: tuple[tuple[str, str | None], ...] = ()
    # (tier, VLLM_ALLREDUCE_USE_FLASHINFER in that tier's engine profile) for the tiers in which a replica
    # of the host has tensor-parallel size >= 2 (FlashInfer's standalone all-reduce; issue 52)
    allreduce: tuple[tuple[str, str | None], ...] = ()


def host_asks(lab: LabConfig) -> dict[str, HostAsk]:
    """Per inventory host: the largest L1 a cell pins there (real engines only) and the L2 folder of its
    nvme cells."""
    from kvoffload.orchestrate.cell.deployment import deployment
    from kvoffload.profiles.resolve import engine_profile, l2_path

    l1: dict[str, float] = {}
    sampler: dict[str, dict[str, str | None]] = {}
    allreduce: dict[str, dict[str, str | None]] = {}
    l2: dict[str, str] = {}
    lmcache_hosts: set[str] = set()
    for node in lab.nodes:
        host = lab.node_lmcache(node)
        for cell in lab.cells:
            if lab.campaign.engine == "vllm":
                dep = deployment(lab, cell, node)
                for replica in dep.replicas:
                    env = engine_profile(dep.gpu_vendor, cell.tier).env
                    sampler.setdefault(replica.host, {})[cell.tier] = env.get(SAMPLER_ENV)
                    if tensor_parallel_size(replica.gpus) >= 2:
                        allreduce.setdefault(replica.host, {})[cell.tier] = env.get(ALLREDUCE_ENV)
            if cell.tier == "gpu" or host is None:
                continue
            lmcache_hosts.add(host.name)
            dep = deployment(lab, cell, node)
            size, _ = cell_l1(cell)
            if lab.campaign.engine == "vllm":  # the simulator's L1 is a byte count, never allocated
                l1[host.name] = max(l1.get(host.name, 0.0), size)
            path = l2_path(dep) if cell.tier == "nvme" else None
            if path is not None:
                l2[host.name] = path
    builds: dict[str, str] = {}
    if lab.campaign.engine == "vllm":
        for host in lab.inventory.group("vllm"):
            builds[host.name] = host_build(lab, host)
    return {
        h.name: HostAsk(
            l1.get(h.name),
            l2.get(h.name),
            h.name in lmcache_hosts,
            builds.get(h.name),
            tuple(sorted(sampler.get(h.name, {}).items())),
            tuple(sorted(allreduce.get(h.name, {}).items())),
        )
        for h in lab.inventory.hosts
    }


def cell_l1(cell: Cell) -> tuple[float, str]:
    """The L1 pool (GiB, as LMCache counts them) an offload cell's lmcache-server is given, and where
    that size comes from: the campaign's `lmcache_l1_size_gb` for its tier, else the tier's profile."""
    if cell.lmcache_l1_size_gb is not None:
        return cell.lmcache_l1_size_gb, f"the campaign's lmcache_l1_size_gb.{cell.tier}"
    from kvoffload.profiles.resolve import lmcache_profile

    return lmcache_profile(cell.tier).l1_size_gb, f"kvoffload/profiles/lmcache/{cell.tier}.yaml l1_size_gb"


def recorded_memory(root: Path) -> dict[str, tuple[int, Path]]:
    """Per host: the MemTotal (bytes) of the newest doctor record under a campaign's results folder
    `root` that has one for it (`doctor`'s doctor.json, `run`'s cheap checks' doctor-run/doctor.json:
    the probe's memory check), and that file; an unreadable record is passed over."""
    files = [f for f in (root / DOCTOR_JSON, root / RUN_DOCTOR_DIR / DOCTOR_JSON) if f.is_file()]
    out: dict[str, tuple[int, Path]] = {}
    for path in sorted(files, key=lambda f: f.stat().st_mtime, reverse=True):
        try:
            record = json.loads(path.read_text(encoding="utf-8"))
        except (OSError, json.JSONDecodeError):
            continue
        hosts = record.get("hosts") if isinstance(record, dict) else None
        for report in hosts if isinstance(hosts, list) else []:
            if not isinstance(report, dict) or report.get("host") in out:
                continue
            for c in report.get("checks") or []:
                total = (c.get("facts") or {}).get("mem_total") if isinstance(c, dict) else None
                if c.get("name") == "memory" and isinstance(total, int) and total > 0:
                    out[str(report["host"])] = (total, path)
    return out


def l1_memory_warnings(lab: LabConfig, memory: Mapping[str, tuple[int, Path]]) -> tuple[list[str], list[str]]:
    """(warnings, hosts not checked): each offload tier whose L1 pool (cell_l1) exceeds the memory
    (MemTotal, `recorded_memory`) of an lmcache-server host its cells run on, and the lmcache-server
    hosts whose memory no doctor record gives. A real lmcache-server pins its pool, and its role's
    preflight refuses a host without room for it; the simulator counts the pool without allocating it,
    so a campaign runs on, and the report bounds capacity and DRAM cost by the host's memory."""
    sizes: dict[tuple[str, str], tuple[float, str]] = {}
    for node in lab.nodes:
        server = lab.node_lmcache(node)
        for cell in lab.cells:
            if server is not None and cell.tier != "gpu":
                sizes[(server.name, cell.tier)] = cell_l1(cell)
    warnings: list[str] = []
    unknown: list[str] = []
    for (host, tier), (gb, source) in sorted(sizes.items()):
        if host not in memory:
            unknown += [] if host in unknown else [host]
            continue
        total, path = memory[host]
        if gb * 2**30 <= total:
            continue
        head = (
            f"tier {tier}: its L1 pool of {gb:g} GiB ({source}) exceeds the {total / 2**30:.1f} GiB of "
            f"memory of {host} (MemTotal, its doctor record {path})"
        )
        if lab.campaign.engine == "vllm":
            tail = "lmcache-server pins its L1, so its preflight will refuse the host"
        else:
            tail = (
                "the simulator counts the pool without allocating it, so its cells run as if the host had "
                "it, and the report bounds the tier's capacity and DRAM cost by the host's memory"
            )
        warnings.append(f"{head}: {tail}; give the campaign a smaller lmcache_l1_size_gb.{tier}")
    return warnings, unknown


def probe_args(ask: HostAsk, venv: str, *, cheap: bool) -> list[str]:
    args = ["--engine-python", f"{venv.rstrip('/')}/bin/python"]
    if ask.l1_gb is not None:
        args += ["--l1-gb", f"{ask.l1_gb:g}", "--pin-gb", f"{min(ask.l1_gb, 4.0):g}"]
    if ask.l2_path is not None:
        args += ["--l2-path", ask.l2_path]
    return args + (list(CHEAP_ARGS) if cheap else [])


def judge(
    host: str,
    probe: Mapping[str, Any],
    ask: HostAsk,
    *,
    engine: str,
    hosts_python: str | None,
    expected: Mapping[str, str],
    lab_pythons: Mapping[str, str] | None = None,
    smoke: Mapping[str, Any] | None = None,
    why_not: str | None = None,
    pair: Mapping[str, Any] | None = None,
    pair_why_not: str | None = None,
) -> dc.NodeReport:
    """A host's report: the probe's checks and the controller's (`smoke`: the pair's round trip on this
    host, orchestrate/checks/round_trip.py; `why_not`: why it did not run; `pair`, `pair_why_not`: the same
    of the
    cell-free pair check, orchestrate/checks/cellfree.py)."""
    found = dc.probe_checks(probe)
    host_python = _probe_python(probe)
    engine_facts = next((c.facts for c in found if c.name == "engine"), {})
    extra = [dc.wheelhouse_python(host_python, hosts_python, lab_pythons)]
    if ask.engine_build is not None:
        extra.append(dc.engine_set(engine_facts, expected))
        versions = engine_facts.get("versions")
        extra.append(
            flashinfer_jit(
                ask.engine_build,
                dict(ask.sampler),
                probe.get("unit_toolchain"),
                versions if isinstance(versions, Mapping) else None,
                dict(ask.allreduce),
                _nvswitch(found),
            )
        )
    pair_here = engine == "vllm" and ask.lmcache and ask.engine_build is not None
    extra.append(dp.check(pair, pair_here, pair_why_not))
    extra.append(dc.smoke_pair(probe, engine, ask.lmcache and ask.engine_build is not None, smoke, why_not))
    return dc.NodeReport(host, (*found, *extra), probe)


def _nvswitch(found: Sequence[Check]) -> bool | None:
    """Whether the probe's fabric check found NVSwitches on the host (None: it could not tell)."""
    count = next((c.facts.get("nvswitches") for c in found if c.name == "fabric"), None)
    return None if count is None else int(count) > 0


def _probe_python(probe: Mapping[str, Any]) -> str | None:
    """The host's python3 version as its probe reported it."""
    version = next((c.facts.get("version") for c in dc.probe_checks(probe) if c.name == "python"), None)
    return str(version) if version else None


def run_doctor(
    lab: LabConfig,
    runner: Runner,
    out: Path,
    *,
    hosts_python: str | None,
    cheap: bool = False,
    venv: str = str(REMOTE_VENV),
    learn_python: bool = False,
    smoke: Smoke | None = None,
    pair_check: PairCheck | None = None,
) -> list[dc.NodeReport]:
    """Probe every host of the inventory; a host that failed or was unreachable gets a `reach` failure.
    The probes' JSON land in `out/<host>.json` (emptied first). `learn_python` (with `hosts_python`
    None): the wheelhouse's Python is the one the hosts report, as `run` learns it without
    --hosts-python (orchestrate/installs/host_python.py); hosts that report different ones fail that check.
    `smoke` (orchestrate/checks/round_trip.py PairSmoke): the vLLM/LMCache pair's round trip, on the nodes
    with a
    pair that fail none of `checks.PAIR_BLOCKERS` (the probes ran first: their record is of the hosts
    before the smoke provisioned them); its facts land in `out/smoke.json`. `pair_check`
    (orchestrate/checks/cellfree.py PairCellFree): the cell-free pair check on the same nodes, after the
    smoke (whose install gives a fresh lab its engine venv); its answers land in
    `out/pair_cellfree.json`. None: the check says it did not run (--no-smoke, --no-pair-check)."""
    from kvoffload.engines.lab import node_sets

    asks = host_asks(lab)
    probes = _probe_hosts(runner, asks, out, venv, cheap)
    # each node's expected versions: the pins of the engine set it installs (kvoffload/engines/lab.py)
    pins = {host: dc.pinned(found.spec.requirements) for host, found in node_sets(lab).items()}
    lab_pythons: dict[str, str] | None = None
    if learn_python and hosts_python is None:
        answered = {h: p for h, p in probes.items() if isinstance(p, dict)}
        lab_pythons = {h: v for h, p in answered.items() if (v := _probe_python(p))}
        if len(set(lab_pythons.values())) == 1:
            hosts_python = next(iter(lab_pythons.values()))

    # why a pair check did not run where no other reason applies
    cheap_why = "`run`'s cheap checks leave it out (`kvoffload-lab doctor` makes it)" if cheap else None
    smoke_why, pair_why = cheap_why or "--no-smoke", cheap_why or "--no-pair-check"

    def report(
        host: str,
        smoke_facts: Mapping[str, Any] | None = None,
        why_not: str | None = smoke_why,
        pair: Mapping[str, Any] | None = None,
        pair_why_not: str | None = pair_why,
    ) -> dc.NodeReport:
        probe, ask = probes[host], asks[host]
        if isinstance(probe, str):
            return dc.unreachable(host, probe)
        return judge(
            host,
            probe,
            ask,
            engine=lab.campaign.engine,
            hosts_python=hosts_python,
            expected=pins.get(host, {}) if ask.engine_build else {},
            lab_pythons=lab_pythons,
            smoke=smoke_facts,
            why_not=why_not,
            pair=pair,
            pair_why_not=pair_why_not,
        )

    reports = {host: report(host) for host in asks}
    pairs = smoke_nodes(lab, asks) if smoke is not None or pair_check is not None else []
    blocked = {h: sorted({c.name for c in reports[h].failed} & dc.PAIR_BLOCKERS) for h in pairs}
    ready = [h for h in pairs if not blocked[h]]
    smoke_found: Mapping[str, Mapping[str, Any]] = {}
    pair_found: Mapping[str, Mapping[str, Any]] = {}
    if smoke is not None and pairs:
        smoke_found = smoke(ready, hosts_python) if ready else {}
        (out / SMOKE_JSON).write_text(json.dumps(smoke_found, indent=1) + "\n", encoding="utf-8")
    if pair_check is not None and pairs:
        pair_found = pair_check(pair_asks(lab, {h: asks[h] for h in ready}, venv)) if ready else {}
        (out / PAIR_JSON).write_text(json.dumps(pair_found, indent=1) + "\n", encoding="utf-8")
    for host in pairs:
        if blocked[host]:
            why = f"{', '.join(blocked[host])} failed (provisioning would refuse the host); fix it first"
            reports[host] = report(
                host,
                why_not=why if smoke is not None else smoke_why,
                pair_why_not=why if pair_check else pair_why,
            )
            continue
        reports[host] = report(
            host,
            (smoke_found.get(host) or {"node": host, "error": "no answer"}) if smoke is not None else None,
            pair=(pair_found.get(host) or {"error": "no answer"}) if pair_check is not None else None,
        )
    return list(reports.values())


def pair_asks(lab: LabConfig, asks: Mapping[str, HostAsk], venv: str) -> dict[str, list[str]]:
    """The cell-free pair check's arguments per host (orchestrate/checks/cellfree.py pair_args): the
    chunk size of the campaign's first offload cell's profile, as the smoke check deploys."""
    from kvoffload.orchestrate.checks.cellfree import pair_args
    from kvoffload.orchestrate.checks.round_trip import offload_cell
    from kvoffload.profiles.resolve import lmcache_profile

    cell = offload_cell(lab)
    if cell is None:  # no offload cell, no lmcache-server: smoke_nodes() names no host
        return {}
    chunk = lmcache_profile(cell.tier).chunk_size
    return {h: pair_args(venv, a.engine_build, chunk, a.l2_path) for h, a in asks.items()}


def _probe_hosts(
    runner: Runner, asks: Mapping[str, HostAsk], out: Path, venv: str, cheap: bool
) -> dict[str, dict[str, Any] | str]:
    """Run the doctor's probe on every host: host -> its answer, or why there is none."""
    shutil.rmtree(out, ignore_errors=True)
    out.mkdir(parents=True)
    extravars = {
        "doctor_probe": str(PROBE),
        "doctor_dest": str(out.resolve()),
        "doctor_args": {h: probe_args(a, venv, cheap=cheap) for h, a in asks.items()},
    }
    ident = f"doctor{'-cheap' if cheap else ''}"
    return fetch_answers(runner, PLAYBOOK, extravars, ident, out, asks, missing="no probe answer")


class Smoke(Protocol):
    """The pair's round trip on some nodes (orchestrate/checks/round_trip.py PairSmoke; tests give a fake)."""

    def __call__(self, nodes: Sequence[str], hosts_python: str | None) -> Mapping[str, Mapping[str, Any]]: ...


class PairCheck(Protocol):
    """The cell-free pair check on some hosts, host -> the node script's arguments (orchestrate/
    pair_cellfree.py PairCellFree; tests give a fake)."""

    def __call__(self, asked: Mapping[str, Sequence[str]]) -> Mapping[str, Mapping[str, Any]]: ...


def smoke_nodes(lab: LabConfig, asks: Mapping[str, HostAsk]) -> list[str]:
    """The nodes with a vLLM/LMCache pair to check: vllm campaigns only, nodes whose lmcache-server is
    their own host (a run is node-local)."""
    if lab.campaign.engine != "vllm":
        return []
    return [
        n.name
        for n in lab.nodes
        if n.name in asks and asks[n.name].lmcache and asks[n.name].engine_build is not None
    ]


def doctor_json(reports: list[dc.NodeReport], campaign: str) -> dict[str, Any]:
    return {
        "schema": 1,
        "campaign": campaign,
        "status": str(dc.worst(r.status for r in reports)),
        "hosts": [r.to_json() for r in reports],
    }


def cheap_gate(lab: LabConfig, runner: Runner, out: Path, *, hosts_python: str | None) -> list[dc.NodeReport]:
    """`run`'s check before its first cell: the cheap checks; a failure is a `UserError` naming each
    host, check and fix (doctor.json beside it in `out`)."""
    reports = run_doctor(lab, runner, out, hosts_python=hosts_python, cheap=True)
    record = doctor_json(reports, lab.campaign.name)
    (out / DOCTOR_JSON).write_text(json.dumps(record, indent=1) + "\n", encoding="utf-8")
    lines = [
        f"  {r.host}: {c.name}: {c.detail}" + (f"; fix: {c.fix}" if c.fix else "")
        for r in reports
        for c in r.failed
        if c.name in dc.CHEAP_CHECKS or c.name == "reach"
    ]
    if lines:
        raise UserError(
            "refusing to start: the doctor's checks failed (`kvoffload-lab doctor INVENTORY` for the "
            f"full table; {out / DOCTOR_JSON}):\n" + "\n".join(lines)
        )
    return reports
