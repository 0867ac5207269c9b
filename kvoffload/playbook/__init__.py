"""The only user of ansible-runner: run a phase playbook, read its events and stats, raise on failure.

ansible-runner's API is untyped keyword arguments; it stays inside this package (STYLE.md). Callers get
`PlaybookResult` or a `PlaybookFailed` naming the failed hosts and tasks.
"""

from kvoffload.playbook.runner import (
    PlaybookCanceled,
    PlaybookFailed,
    PlaybookResult,
    PlaybookRunner,
    TaskFailure,
    ansible_dir,
    request_stop,
)

__all__ = [
    "PlaybookCanceled",
    "PlaybookFailed",
    "PlaybookResult",
    "PlaybookRunner",
    "TaskFailure",
    "ansible_dir",
    "request_stop",
]
