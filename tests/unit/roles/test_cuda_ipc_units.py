"""What CUDA IPC between the replicas and lmcache-server needs of their rendered units (issue 41, 5f).

LMCache 0.5.6 maps a replica's KV through torch's storage IPC by default (lmcache wheel,
lmcache/v1/platform/devices/cuda/ipc_wrapper.py CudaIPCWrapper, "needs a shared /dev/shm"), and legacy
CUDA IPC handles do not cross PID namespaces: one user, one /dev/shm, one PID namespace. PrivateTmp=,
which both units set, mounts private /tmp and /var/tmp only and leaves /dev/shm shared. The doctor's
cuda_ipc fix names the same (kvoffload/doctor/probe.py).
"""

from __future__ import annotations

import pytest

from tests.unit.roles.test_rendered_units import CASES, _directives, rendered_files

# Each would give a unit its own IPC namespace, /dev (with its own /dev/shm) or PID namespace.
SPLITTING = ("PrivateIPC", "PrivateDevices", "PrivatePIDs", "IPCNamespacePath", "JoinsNamespaceOf")


@pytest.mark.parametrize(("tier", "engine"), [c for c in CASES if c[0] != "gpu"])
def test_replicas_and_server_share_user_dev_shm_and_pid_namespace(tier: str, engine: str) -> None:
    files = rendered_files(tier, engine)
    units = {name: _directives(files[name]) for name in ("kvoffload-vllm@.service", "kvoffload-lmcache.service")}
    assert {d["User"][0] for d in units.values()} == {"kvoffload-engine"}
    for name, d in units.items():
        for key in SPLITTING:
            assert key not in d, f"{name}: {key}={d.get(key)}"
        # no path directive hides, remounts or makes /dev/shm read-only
        assert not [k for k, values in d.items() for v in values if "/dev/shm" in v], name
        assert d["PrivateTmp"] == ["yes"], name  # private /tmp and /var/tmp only
