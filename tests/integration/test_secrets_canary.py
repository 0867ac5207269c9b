"""A canary Hugging Face token through the real playbooks: it reaches the download, and nothing else.

The canary goes in where a user puts the token (the inventory's `vllm_hf_token`, as ansible-vault would
hand it to Ansible, and the controller's HF_TOKEN), then every file the run produced is searched for it
(ansible-runner's artifacts: command, job_events, stdout, fact_cache; its env/ folder; the results
folder), as bytes and as base64. Two runs against this machine (connection local):

- the vllm role's model tasks through the orchestrator's PlaybookRunner, with a stand-in for the venv's
  python that records a digest of what the download got on stdin, in argv and in its environment
  (nothing is downloaded): the token must arrive on stdin, the vault one first, and nowhere else;
- `kvoffload-lab provision --check` (with --diff), the CLI end to end.

Needs root (the role stages models root-owned).
"""

from __future__ import annotations

import base64
import hashlib
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml

from kvoffload.playbook import PlaybookRunner

REPO = Path(__file__).resolve().parents[2]
VAULT_CANARY = "kvoffload-canary-7f3c9a"
ENV_CANARY = "kvoffload-canary-env-5d21e8"
DATASET = REPO / "data" / "tau2-bench" / "gpt-4.1_airline_default_gpt-4.1_1trials.json"

pytestmark = [
    pytest.mark.integration,
    pytest.mark.skipif(os.geteuid() != 0, reason="the vllm role stages models owned by root"),
    pytest.mark.timeout(600),
]


def digest(text: str) -> str:
    return hashlib.sha256(text.encode()).hexdigest()


def forms(secret: str) -> list[bytes]:
    """The secret as bytes and as the base64 it would take at any of the 3 offsets of an encoded blob."""
    raw = secret.encode()
    out = [raw]
    for pad in range(3):
        encoded = base64.b64encode(b"\0" * pad + raw)
        out.append(encoded[4 if pad else 0 : -4])  # only the groups made of the secret's bytes alone
    return out


def leaks(root: Path, secrets: list[str], skip: tuple[Path, ...] = ()) -> list[str]:
    """`file: secret` for every file under root (but `skip`) whose name or bytes hold a secret."""
    found = []
    for path in sorted(root.rglob("*")):
        if not path.is_file() or path in skip:
            continue
        data = path.read_bytes()
        for secret in secrets:
            if secret in str(path) or any(form in data for form in forms(secret)):
                found.append(f"{path.relative_to(root)}: {secret}")
    return found


def inventory(path: Path, hostvars: dict[str, Any], *, campaign: dict[str, Any] | None = None) -> Path:
    host = {"ansible_connection": "local", "ansible_python_interpreter": sys.executable, **hostvars}
    all_vars: dict[str, Any] = {"kvoffload_campaign": campaign} if campaign else {}
    path.write_text(
        yaml.safe_dump(
            {
                "all": {
                    "vars": all_vars,
                    "hosts": {"box1": host},
                    "children": {"vllm": {"hosts": {"box1": None}}, "client": {"hosts": {"box1": None}}},
                }
            }
        )
    )
    return path


FAKE_PYTHON = """#!{python}
# Stands in for the venv's python in the download task: records digests only, stages a config.json.
import hashlib, json, os, sys
digest = lambda s: hashlib.sha256(s.encode()).hexdigest()
code, repo_id, local_dir = sys.argv[2], sys.argv[3], sys.argv[4]
record = {{
    "stdin": digest(sys.stdin.read()),
    "argv": [digest(a) for a in sys.argv[1:]],
    "env": sorted(digest(v) for v in os.environ.values()),
    "repo_id": repo_id,
}}
with open({record!r}, "w") as f:
    json.dump(record, f)
os.makedirs(local_dir, exist_ok=True)
with open(os.path.join(local_dir, "config.json"), "w") as f:
    f.write("{{}}")
"""

STAGE = """---
- name: Stage a hub model with the vllm role (its model tasks; the role's argument check runs too)
  hosts: vllm
  gather_facts: true
  roles:
    - role: kvoffload
    - role: vllm
"""


@pytest.fixture
def ansible_home(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """This repository's ansible.cfg, roles and modules (the roles' static imports resolve them even where
    tags skip the task), with one extra playbook."""
    home = tmp_path / "ansible"
    (home / "playbooks").mkdir(parents=True)
    shutil.copy(REPO / "ansible.cfg", home / "ansible.cfg")
    (home / "roles").symlink_to(REPO / "roles")
    (home / "plugins").symlink_to(REPO / "plugins")
    (home / ".collections").symlink_to(REPO / ".collections")  # ansible.cfg's collections_path
    (home / "playbooks" / "stage.yml").write_text(STAGE)
    monkeypatch.setenv("KVOFFLOAD_ANSIBLE_DIR", str(home))
    return home


@pytest.mark.parametrize(
    ("vault", "env", "expected"),
    [
        (VAULT_CANARY, None, VAULT_CANARY),
        (None, ENV_CANARY, ENV_CANARY),
        (VAULT_CANARY, ENV_CANARY, VAULT_CANARY),  # the vault's token wins
        (None, None, ""),
    ],
    ids=["vault", "controller-env", "both", "none"],
)
def test_the_token_reaches_the_download_on_stdin_only(
    ansible_home: Path,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    vault: str | None,
    env: str | None,
    expected: str,
) -> None:
    if env is None:
        monkeypatch.delenv("HF_TOKEN", raising=False)
    else:
        monkeypatch.setenv("HF_TOKEN", env)
    record = tmp_path / "download.json"
    venv = tmp_path / "venv"
    (venv / "bin").mkdir(parents=True)
    fake = venv / "bin" / "python"
    fake.write_text(FAKE_PYTHON.format(python=sys.executable, record=str(record)))
    fake.chmod(0o755)
    # The role's checks run under --tags model too (tagged always): a loopback address it has, and the
    # CPU build (no GPU on this machine to check for).
    checked = {"ansible_host": "127.0.0.1", "kvoffload_engine_build": "cpu"}
    inv = inventory(tmp_path / "hosts.yml", {**checked, "vllm_hf_token": vault} if vault else checked)
    results = tmp_path / "results" / "canary"
    runner = PlaybookRunner(inv, results / "ansible")
    extravars = {
        "kvoffload_engine": "vllm",
        "kvoffload_venv": str(venv),
        "vllm_model_hub_id": "example-org/gated-model",
        "vllm_model_dir": str(tmp_path / "models" / "example-org--gated-model"),
    }
    first = runner.run("stage.yml", extravars, tags=("model",), ident="stage")
    assert first.changed == {"box1": 2}  # the models folder, the download

    seen = json.loads(record.read_text())
    assert seen["repo_id"] == "example-org/gated-model"
    assert seen["stdin"] == digest(expected)
    for secret in (VAULT_CANARY, ENV_CANARY):
        assert digest(secret) not in seen["argv"], "the token is on the download's command line"
        assert digest(secret) not in seen["env"], "the token is in the download's environment"
    # idempotent: staged once
    assert runner.run("stage.yml", extravars, tags=("model",), ident="again").total_changed == 0
    # check mode with --diff (the download is skipped there; the role's other tasks show their diff)
    runner.run("stage.yml", extravars, tags=("model",), check=True, ident="check")

    assert list((first.artifacts / "fact_cache").iterdir()), "facts were cached (ansible_env included)"
    assert list((first.artifacts / "job_events").iterdir())
    assert not (results / "ansible" / "env").exists()
    assert leaks(tmp_path, [VAULT_CANARY, ENV_CANARY], skip=(inv,)) == []
    if vault:  # the search itself finds the canary where it is by design
        assert leaks(tmp_path, [VAULT_CANARY]) == ["hosts.yml: " + VAULT_CANARY]


def test_provision_check_writes_the_token_nowhere(tmp_path: Path) -> None:
    campaign = {
        "name": "canary",
        "model": "tiny-llama",
        "gpu_vendor": "nvidia",
        "engine": "sim",
        "sim_profile": "tiny",
        "dataset": {"code": "tau2-bench-v1", "path": str(DATASET)},
        "tiers": ["gpu"],
        "concurrency": [2],
        "num_rounds": [5],
        "isl": 16384,
        "osl": 16,
        "max_sessions": 2,
    }
    hostvars = {"ansible_host": "127.0.0.1", "vllm_replicas": [{"index": 0, "gpus": "0"}]}
    inv = inventory(tmp_path / "hosts.yml", {**hostvars, "vllm_hf_token": VAULT_CANARY}, campaign=campaign)
    env = {**os.environ, "HF_TOKEN": ENV_CANARY}
    env.pop("KVOFFLOAD_ANSIBLE_DIR", None)
    results = tmp_path / "results"
    proc = subprocess.run(
        [sys.executable, "-m", "kvoffload.cli.main", "provision", str(inv), "--check", "--no-wheelhouse",
         "--results", str(results), "--wheel-cache", str(tmp_path / "wheels")],
        env=env, cwd=REPO, capture_output=True, text=True, timeout=540, check=False,
    )  # fmt: skip
    assert (results / "canary" / "ansible" / "artifacts").is_dir(), proc.stderr[-3000:]
    artifacts = {p.name.split("-", 1)[1]: p for p in (results / "canary" / "ansible" / "artifacts").iterdir()}
    # preflight passed and provision ran in check mode with --diff. Its outcome depends on this machine
    # (check mode stops at the first service of a package it did not install, or where systemd is not
    # PID 1): the subject here is what the run wrote, so a provision failure is allowed, nothing earlier.
    assert set(artifacts) == {"preflight", "provision"}, (proc.returncode, proc.stderr[-3000:])
    assert (artifacts["preflight"] / "status").read_text().strip() == "successful"
    assert proc.returncode == 0 or "playbook provision.yml failed" in proc.stderr, proc.stderr[-3000:]
    argv = json.loads((artifacts["provision"] / "command").read_text())["command"]
    assert "--check" in argv and "--diff" in argv
    assert list((artifacts["provision"] / "fact_cache").iterdir())
    assert leaks(tmp_path, [VAULT_CANARY, ENV_CANARY], skip=(inv,)) == []
    for stream in (proc.stdout, proc.stderr):
        assert VAULT_CANARY not in stream and ENV_CANARY not in stream
