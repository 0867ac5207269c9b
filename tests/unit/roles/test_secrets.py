"""Every task that handles a secret hides it: no_log, no diff, and it never goes where Ansible records.

A task handles a secret when its arguments, vars, environment, loop or condition name a secret variable
(the options marked `no_log` in any role's argument_specs, and anything about the Hugging Face token:
`vllm_hf_token`, its file, HF_TOKEN) or when it renders a template that does. Such a task must set
`no_log: true` (results, events, the module's log on the host) and `diff: false` (`provision --check`
runs with --diff), and must not put the secret in `environment:` (Ansible prefixes the remote command
line with it: `ps` on the host, sudo's log), on a command line, in a fact (`set_fact`, `cacheable`: the
fact cache), in a registered result a later task could print, or in an async job file on the host.
Templates never name a secret: rendered files are not secret stores. The checker itself is tested on
tasks written to break each rule, so this gate can fail.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

REPO = Path(__file__).resolve().parents[3]
ROLES = REPO / "roles"
BLOCK_KEYS = ("block", "rescue", "always")
COMMAND_MODULES = ("command", "shell", "raw", "script")
# Keys of a task that are not its module
TASK_KEYWORDS = {
    "name", "when", "tags", "vars", "environment", "loop", "loop_control", "with_items", "register",
    "no_log", "diff", "become", "become_user", "become_method", "changed_when", "failed_when",
    "ignore_errors", "delegate_to", "run_once", "notify", "listen", "async", "poll", "retries", "delay",
    "until", "check_mode", "args", "block", "rescue", "always", "throttle", "timeout", "module_defaults",
    "any_errors_fatal", "ignore_unreachable", "local_action", "with_dict", "with_fileglob", "debugger",
}  # fmt: skip


def secret_names() -> set[str]:
    """Role options marked no_log in any argument spec (every entry point)."""
    names: set[str] = set()
    for spec_file in ROLES.glob("*/meta/argument_specs.yml"):
        specs = yaml.safe_load(spec_file.read_text())["argument_specs"]
        for entry in specs.values():
            for name, option in (entry.get("options") or {}).items():
                if option.get("no_log"):
                    names.add(name)
    return names


SECRETS = secret_names()
SECRET_REF = re.compile(
    r"hf_token|HUGGING_FACE_HUB_TOKEN|" + "|".join(rf"\b{re.escape(n)}\b" for n in sorted(SECRETS)),
    re.IGNORECASE,
)


def names_secret(value: Any) -> bool:
    return bool(SECRET_REF.search(yaml.safe_dump(value))) if value is not None else False


def walk(tasks: Any, where: str) -> Iterator[tuple[str, dict[str, Any]]]:
    """Every task of a task list, blocks included (a block's own keys count for its tasks)."""
    for task in tasks or []:
        if not isinstance(task, dict):
            continue
        if any(k in task for k in BLOCK_KEYS):
            for key in BLOCK_KEYS:
                yield from walk(task.get(key), where)
        yield where, task


def module_of(task: dict[str, Any]) -> tuple[str, Any]:
    for key, value in task.items():
        if key not in TASK_KEYWORDS:
            return key.rsplit(".", 1)[-1], value
    return "", None


def template_source(role_dir: Path, task: dict[str, Any]) -> str:
    name, args = module_of(task)
    if name != "template" or not isinstance(args, dict) or "{{" in str(args.get("src", "{{")):
        return ""
    path = role_dir / "templates" / str(args["src"])
    return path.read_text() if path.is_file() else ""


def handles_secret(task: dict[str, Any], role_dir: Path) -> bool:
    body = {k: v for k, v in task.items() if k not in (*BLOCK_KEYS, "name")}
    return names_secret(body) or bool(SECRET_REF.search(template_source(role_dir, task)))


def problems(task: dict[str, Any], role_dir: Path) -> list[str]:
    """What is wrong with a task that handles a secret (empty for a task that does not handle one)."""
    if not handles_secret(task, role_dir):
        return []
    found = []
    name, args = module_of(task)
    if task.get("no_log") is not True:
        found.append("no_log: true missing")
    if task.get("diff") is not False:
        found.append("diff: false missing")
    if names_secret(task.get("environment")):
        found.append("secret in environment: (the remote command line)")
    if name in COMMAND_MODULES:
        line = args if isinstance(args, str) else {k: v for k, v in (args or {}).items() if k != "stdin"}
        if names_secret(line):
            found.append("secret on a command line (ps on the host); pass it on stdin")
    if name == "set_fact":  # a fact may be cached (fact cache, `cacheable`) and outlives the task
        found.append("secret in a fact (fact cache)")
    if "register" in task:
        found.append("registers a result holding the secret")
    if "async" in task:
        found.append("async: the job file on the host holds the arguments")
    return found


def role_task_files() -> list[Path]:
    return sorted(p for p in ROLES.glob("*/*/*.yml") if p.parent.name in ("tasks", "handlers"))


def all_tasks() -> Iterator[tuple[Path, dict[str, Any]]]:
    for path in role_task_files():
        for _where, task in walk(yaml.safe_load(path.read_text()), str(path)):
            yield path, task
    for path in sorted((REPO / "playbooks").glob("*.yml")):
        for play in yaml.safe_load(path.read_text()) or []:
            for key in ("pre_tasks", "tasks", "post_tasks", "handlers"):
                for _where, task in walk(play.get(key), str(path)):
                    yield path, task


def role_dir(path: Path) -> Path:
    return path.parents[1] if path.is_relative_to(ROLES) else REPO


def test_the_token_is_a_declared_secret() -> None:
    assert "vllm_hf_token" in SECRETS
    defaults = yaml.safe_load((ROLES / "vllm" / "defaults" / "main.yml").read_text())
    assert defaults["vllm_hf_token"] == ""  # never a real token in the repository


def test_the_scan_finds_the_download_task() -> None:
    handling = [t["name"] for p, t in all_tasks() if handles_secret(t, role_dir(p))]
    # the one task that needs the token; a second one would have to justify itself here
    assert handling == ["Download the model from the hub"], handling


def test_every_task_that_handles_a_secret_hides_it() -> None:
    bad = {
        f"{p.relative_to(REPO)}: {t.get('name')}": found
        for p, t in all_tasks()
        if (found := problems(t, role_dir(p)))
    }
    assert not bad, bad


def test_the_download_gets_the_token_on_stdin() -> None:
    tasks = yaml.safe_load((ROLES / "vllm" / "tasks" / "model.yml").read_text())
    task = next(t for t in tasks if t["name"] == "Download the model from the hub")
    args = task["ansible.builtin.command"]
    assert args["stdin"] == "{{ _vllm_hf_token }}"
    assert "sys.stdin.read()" in args["argv"][2] and "token=" in args["argv"][2]
    assert not names_secret(task["environment"]) and not names_secret(args["argv"])
    assert "vllm_hf_token_file" in task["vars"]["_vllm_hf_token"]


@pytest.mark.parametrize(
    "template", sorted(ROLES.glob("*/templates/**/*.j2")), ids=lambda p: str(p.relative_to(ROLES))
)
def test_no_template_names_a_secret(template: Path) -> None:
    assert not SECRET_REF.search(template.read_text()), f"{template} names a secret"


# -- the checker on tasks that break each rule ---------------------------------------------------------
STDIN = {"argv": ["x"], "stdin": "{{ vllm_hf_token }}"}


def task_with(module: str = "ansible.builtin.command", args: Any = None, **keys: Any) -> dict[str, Any]:
    """A task that handles the token correctly, changed by `keys` (None drops a key)."""
    task = {"name": "t", module: STDIN if args is None else args, "no_log": True, "diff": False, **keys}
    return {k: v for k, v in task.items() if v is not None}


BROKEN = [
    (task_with(no_log=None), "no_log: true missing"),
    (task_with(diff=None), "diff: false missing"),
    (task_with(args={"argv": ["x"]}, environment={"HF_TOKEN": "{{ vllm_hf_token }}"}),
     "secret in environment: (the remote command line)"),
    (task_with(args={"argv": ["x", "--token", "{{ _vllm_hf_token }}"]}),
     "secret on a command line (ps on the host); pass it on stdin"),
    (task_with("ansible.builtin.shell", "curl -H {{ lookup('env', 'HF_TOKEN') }}"),
     "secret on a command line (ps on the host); pass it on stdin"),
    (task_with("ansible.builtin.set_fact", {"tok": "{{ vllm_hf_token }}"}), "secret in a fact (fact cache)"),
    (task_with(register="r"), "registers a result holding the secret"),
    (task_with(**{"async": 60}), "async: the job file on the host holds the arguments"),
]  # fmt: skip


@pytest.mark.parametrize(("task", "problem"), BROKEN, ids=[p for _t, p in BROKEN])
def test_the_checker_catches(task: dict[str, Any], problem: str) -> None:
    assert problem in problems(task, ROLES / "vllm")


def test_the_checker_sees_a_template_that_names_a_secret(tmp_path: Path) -> None:
    (tmp_path / "templates").mkdir()
    (tmp_path / "templates" / "env.j2").write_text("HF_TOKEN={{ vllm_hf_token }}\n")
    task = {"name": "t", "ansible.builtin.template": {"src": "env.j2", "dest": "/etc/x", "mode": "0600"}}
    assert problems(task, tmp_path) == ["no_log: true missing", "diff: false missing"]


def test_the_checker_passes_a_task_without_secrets() -> None:
    task = task_with(args={"argv": ["x", "{{ replay_tokenizer }}"]}, no_log=None, diff=None, register="r")
    assert problems(task, ROLES / "vllm") == []
