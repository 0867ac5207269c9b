"""A systemctl stand-in with state, for the collection's modules that drive systemd.

`show` prints each asked unit from a JSON file (name -> properties; absent: not-found), `is-active`
each one's ActiveState (exiting 3 when one is not active), `list-unit-files` every unit with its
UnitFileState; `stop`, `enable`, `restart`, `start` and `daemon-reload` log "<verb> <units>" and change
the file as systemd would: a stop leaves a unit inactive with the Result that `on_stop` gives it
(default success), a start or restart leaves it in the ActiveState that `on_start` gives it (default
active; failed with Result exit-code), an enable sets UnitFileState enabled. A start or restart of a
unit in `refuse` leaves it failed and exits 1, as systemctl does when the service exits at once
(each refusal takes one of the unit's entries there: a unit named twice is refused twice); one also
in `auto_restart` is left activating (SubState auto-restart), as systemd leaves a unit with Restart=;
one also in `keeps_failing` stays so, its NRestarts one more at each `show` (each restart failed).
A journalctl stand-in beside it prints `journal`'s lines for the unit it is asked about (`--unit`),
else "-- No entries --".
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

SCRIPT = """#!{python}
import json, sys
path, log = {state!r}, {log!r}
state = json.load(open(path))
args = sys.argv[1:]
units = args[args.index("--") + 1:] if "--" in args else []
verb = args[0]
units_only = {{k: v for k, v in state.items() if k not in ("on_stop", "on_start", "refuse", "auto_restart", "keeps_failing")}}
if verb == "list-unit-files":
    for unit, props in units_only.items():
        if props.get("UnitFileState"):
            print(unit, props["UnitFileState"], "enabled")
    sys.exit(0)
if verb == "is-active":
    answers = [units_only.get(u, {{}}).get("ActiveState", "inactive") for u in units]
    print("\\n".join(answers))
    sys.exit(0 if all(a == "active" for a in answers) else 3)
if verb != "show":
    failing = []
    open(log, "a").write(" ".join([verb, *units]) + "\\n")
    for unit in units:
        props = state[unit]
        if verb == "stop":
            props.update(ActiveState="inactive", SubState="dead", Result=state["on_stop"].get(unit, "success"))
        elif verb == "enable":
            props["UnitFileState"] = "enabled"
        else:
            refused = unit in state["refuse"] and verb in ("start", "restart")
            if refused:
                state["refuse"].remove(unit)
                failing.append(unit)
            props["ActiveState"] = "failed" if refused else state["on_start"].get(unit, "active")
            props["Result"] = "exit-code" if props["ActiveState"] == "failed" else "success"
            if refused and unit in state["auto_restart"]:  # systemd starts it again (Restart=)
                props.update(ActiveState="activating", SubState="auto-restart")
                props["NRestarts"] = props.get("NRestarts", 0) + 1
    json.dump(state, open(path, "w"))
    if failing:
        sys.stderr.write("Job for " + failing[0] + " failed because the control process exited with error code.\\n")
        sys.exit(1)
    sys.exit(0)
blocks = []
for unit in units:
    props = state.get(unit, {{"LoadState": "not-found", "ActiveState": "inactive"}})
    if props.get("SubState") == "auto-restart" and unit in state["keeps_failing"]:
        props["NRestarts"] = props.get("NRestarts", 0) + 1  # systemd tried again, and it failed again
        json.dump(state, open(path, "w"))
    blocks.append("\\n".join(f"{{k}}={{v}}" for k, v in {{"Id": unit, **props}}.items()))
print("\\n\\n".join(blocks))
"""

JOURNALCTL = """#!{python}
import json, sys
journal = json.load(open({journal!r}))
unit = sys.argv[sys.argv.index("--unit") + 1]
print("\\n".join(journal.get(unit) or ["-- No entries --"]))
"""


def stateful_systemctl(
    tmp_path: Path,
    units: dict[str, dict[str, str]],
    *,
    on_stop: dict[str, str] | None = None,
    on_start: dict[str, str] | None = None,
    refuse: list[str] | None = None,
    auto_restart: list[str] | None = None,
    keeps_failing: list[str] | None = None,
    journal: dict[str, list[str]] | None = None,
) -> tuple[Path, Path]:
    """(the folder to put first on PATH, the log of the calls that change state)."""
    bindir, state, log = tmp_path / "bin", tmp_path / "state.json", tmp_path / "systemctl.log"
    bindir.mkdir()
    extra = {"on_stop": on_stop or {}, "on_start": on_start or {}, "refuse": refuse or [],
             "auto_restart": auto_restart or [], "keeps_failing": keeps_failing or []}  # fmt: skip
    state.write_text(json.dumps({**units, **extra}))
    (tmp_path / "journal.json").write_text(json.dumps(journal or {}))
    tool = bindir / "systemctl"
    tool.write_text(SCRIPT.format(python=sys.executable, state=str(state), log=str(log)))
    reader = bindir / "journalctl"
    reader.write_text(JOURNALCTL.format(python=sys.executable, journal=str(tmp_path / "journal.json")))
    for script in (tool, reader):
        script.chmod(0o755)
    return bindir, log


def calls(log: Path) -> list[str]:
    """The state-changing calls so far, one "<verb> <units>" each."""
    return log.read_text().splitlines() if log.exists() else []
