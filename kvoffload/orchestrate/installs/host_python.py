"""The hosts' Python, learned before the wheelhouse is built (playbooks/host_python.yml).

A wheelhouse holds one interpreter's wheels (LMCache and torch ship one wheel per Python minor, and
environment markers follow the full version), so `run` builds it for the python3 the hosts report when
`--hosts-python` is not given: one playbook run over every host, reading the `python` fact only. Every
host of a lab must report the same X.Y.Z: a lab has one wheelhouse. A host that does not answer does not
stop the campaign here: the others decide (a node down takes down only its own cells, in the phases
that reach it, as `run` promises; tests/lab/test_lab_faults.py), and its name is logged; no answer
at all is an error. An explicit `--hosts-python` skips this; provision's check
(roles/preflight/tasks/host_python.yml) still guards it. Logs, prints nothing.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from typing import TYPE_CHECKING

from kvoffload.errors import UserError
from kvoffload.orchestrate.playbooks_api import HOST_PYTHON
from kvoffload.playbook import PlaybookFailed

if TYPE_CHECKING:
    from kvoffload.orchestrate.playbooks_api import Runner

PLAYBOOK = HOST_PYTHON  # playbooks_api names it
IDENT = "host-python"
log = logging.getLogger(__name__)


def agreed_python(versions: Mapping[str, str]) -> str:
    """The one Python every host reports (host -> X.Y.Z); a `UserError` naming each host's when they
    differ, or when no host reported one."""
    if not versions:
        raise UserError(
            f"no host reported its Python (playbooks/{PLAYBOOK}): is any host in the groups vllm, lmcache, "
            "lb, client?"
        )
    found = set(versions.values())
    if len(found) == 1:
        return found.pop()
    listing = "\n".join(f"  {host}: Python {version}" for host, version in sorted(versions.items()))
    raise UserError(
        "the hosts run different Pythons:\n"
        f"{listing}\n"
        "every host of a lab must run the same release (the same X.Y.Z python3): the wheelhouse is one "
        "per lab and holds one interpreter's wheels; bring the hosts to one release (README, supported "
        "hosts)"
    )


def learn_hosts_python(runner: Runner) -> str:
    """Ask every host for its python3 version (one round trip); the version the hosts that answered
    agree on. Hosts that did not answer are logged with the reason; when none answered, a `UserError`
    names each host and its reason."""
    try:
        result = runner.run(PLAYBOOK, {}, ident=IDENT)
    except PlaybookFailed as exc:
        if not exc.result.failures:
            raise
        result = exc.result
        lines = [
            f"  {f.host}: {'unreachable' if f.unreachable else 'failed'} at '{f.task}': {f.message}"
            for f in result.failures
        ]
        if not any(facts.get("python") for facts in result.facts.values()):
            raise UserError(
                "could not read the hosts' Python, for which the wheelhouse is built (or give "
                f"--hosts-python X.Y.Z); artifacts: {result.artifacts}\n" + "\n".join(lines)
            ) from exc
        log.warning(
            "the wheelhouse is built for the Python of the hosts that answered; these did not (their cells "
            "fail where they are reached):\n%s",
            "\n".join(lines),
        )
    versions = {host: str(facts["python"]) for host, facts in result.facts.items() if facts.get("python")}
    return agreed_python(versions)
