#!/usr/bin/python3
"""Ansible module: empty a running LMCache server's fs_native L2 in place, through its object API.

Of the kvoffload.lab collection, called by its lmcache_server role between two cells that keep the
same engines (the nvme tier's cold start by reset). `POST /cache/clear` empties L1 only, and deleting
the files behind the server would leave its own account of L2 stale (its usage gauge and the L2
eviction controller's count of bytes). So the module lists the object files in the L2 folder, turns
each name back into the object's key, and deletes the keys with `DELETE /cache/objects {"tier": "l2"}`
(LMCache 0.5.6; `GET /cache/objects` would list them, but fs_native does not implement listing). The
server then deletes the files itself and keeps its accounting right. The folder is listed again and
the pass repeated while objects are found (a store still in flight writes one after a listing), a
bounded number of times: an object still there after the last pass fails the task. Files whose names
are not objects (the adapter's temporary files) are left alone: the module deletes only through the
server, never a file.

fs_native names a file `<model>@<kv_rank, hex>@<object group, hex>@<chunk hash, hex>[@<salt>].data`,
with each `/` of the model name written `-SEP-` (seen on LMCache 0.5.6, see docs/contracts.md).
Standard library only: it runs on the host's own python3.
"""

from __future__ import annotations

import json
import os
import re
import time
import urllib.error
import urllib.request

from ansible.module_utils.basic import AnsibleModule

DOCUMENTATION = r"""
module: kvoffload_l2_clear
short_description: Empty a running LMCache server's fs_native L2 through DELETE /cache/objects
version_added: "0.1.0"
author: kvoffload-lab
description:
  - Lists the object files directly under I(path), parses their names into LMCache object keys and
    asks the server at I(url) to delete them from L2, in batches; then checks that none is left.
  - Repeats the listing and the delete while objects are found, at most I(passes) times. Fails on an
    error answer of the server, and when objects remain after the last pass.
  - In check mode, reports how many objects it would delete and deletes nothing.
options:
  path: {type: path, required: true, description: "The L2 adapter's base_path."}
  url: {type: str, required: true, description: "Base URL of the server's HTTP API, e.g. http://10.0.0.2:8080."}
  batch_size: {type: int, default: 5000, description: "Keys per DELETE request (LMCache: at most 10000)."}
  timeout: {type: float, default: 60, description: "Seconds to wait for each answer of the server."}
  passes: {type: int, default: 5, description: "Listings and deletes at most, 0.2 s apart."}
"""

EXAMPLES = r"""
- name: Empty the L2 of the LMCache server between two cells
  kvoffload.lab.kvoffload_l2_clear:
    path: /mnt/kvoffload-l2/lmcache
    url: http://127.0.0.1:8080
  register: l2_clear

- name: Say how much was dropped
  ansible.builtin.debug:
    msg: "{{ l2_clear.deleted }} of {{ l2_clear.found }} objects deleted in {{ l2_clear.requests }} requests"

- name: A large L2, in smaller requests with more patience
  kvoffload.lab.kvoffload_l2_clear:
    path: /mnt/kvoffload-l2/lmcache
    url: http://10.0.0.2:8080
    batch_size: 2000
    timeout: 120
    passes: 10
"""

RETURN = r"""
found:
  description: Object files found over every pass.
  type: int
  returned: always
ignored:
  description: Files left alone because their names are not objects.
  type: int
  returned: always
deleted:
  description: Keys the server reported deleted (0 in check mode).
  type: int
  returned: always
requests:
  description: DELETE requests sent.
  type: int
  returned: always
"""

SUFFIX = ".data"
SEP = "-SEP-"
_HEX = re.compile(r"^[0-9a-f]+$")
_RANK = re.compile(r"^(0x)?[0-9a-f]+$")


def object_key(name: str) -> dict[str, object] | None:
    """The `EncodedObjectKey` of one fs_native file name, or None when it is not an object file."""
    if not name.endswith(SUFFIX):
        return None
    parts = name[: -len(SUFFIX)].split("@")
    salt = ""
    if len(parts) == 5:
        salt = parts.pop()
    if len(parts) != 4:
        return None
    model, rank, group, chunk = parts
    if not model or not _RANK.match(rank) or not _HEX.match(group) or not _HEX.match(chunk) or len(chunk) % 2:
        return None
    return {
        "chunk_hash_hex": chunk,
        "model_name": model.replace(SEP, "/"),
        "kv_rank": int(rank, 16),
        "object_group_id": int(group, 16),
        "cache_salt": salt,
    }


def object_files(path: str) -> tuple[list[str], list[str]]:
    """(object file names, other file names) directly under `path`; sub-folders are not looked into."""
    objects, others = [], []
    try:
        entries = list(os.scandir(path))
    except FileNotFoundError:
        return [], []
    for entry in entries:
        if entry.is_dir(follow_symlinks=False):
            continue
        (objects if object_key(entry.name) is not None else others).append(entry.name)
    return sorted(objects), sorted(others)


def delete_keys(url: str, keys: list[dict[str, object]], timeout: float) -> dict[str, object]:
    """One `DELETE /cache/objects` of L2 keys; the server's JSON answer."""
    body = json.dumps({"tier": "l2", "keys": keys}).encode()
    request = urllib.request.Request(
        url.rstrip("/") + "/cache/objects",
        data=body,
        method="DELETE",
        headers={"Content-Type": "application/json"},
    )
    with urllib.request.urlopen(request, timeout=timeout) as response:
        answer = json.loads(response.read() or b"{}")
    if not isinstance(answer, dict):
        raise ValueError(f"unexpected answer {answer!r}")
    return answer


def main() -> None:
    module = AnsibleModule(
        argument_spec={
            "path": {"type": "path", "required": True},
            "url": {"type": "str", "required": True},
            "batch_size": {"type": "int", "default": 5000},
            "timeout": {"type": "float", "default": 60.0},
            "passes": {"type": "int", "default": 5},
        },
        supports_check_mode=True,
    )
    p = module.params
    if not 1 <= p["batch_size"] <= 10000:
        module.fail_json(msg=f"batch_size must be 1..10000 (LMCache's limit), got {p['batch_size']}")
    if p["passes"] < 1:
        module.fail_json(msg=f"passes must be at least 1, got {p['passes']}")
    names, others = object_files(p["path"])
    if not names or module.check_mode:
        module.exit_json(changed=bool(names), found=len(names), ignored=len(others), deleted=0, requests=0)
    found = deleted = requests = 0
    for attempt in range(p["passes"]):
        if attempt:
            time.sleep(0.2)
            names, others = object_files(p["path"])
            if not names:
                break
        found += len(names)
        keys = [k for k in (object_key(n) for n in names) if k is not None]
        for start in range(0, len(keys), p["batch_size"]):
            answer = _delete(module, keys[start : start + p["batch_size"]], found, deleted)
            requests += 1
            deleted += int(answer.get("deleted", 0))
    else:
        names, others = object_files(p["path"])
    if names:
        module.fail_json(
            msg=f"{len(names)} L2 objects are still in {p['path']} after {p['passes']} passes "
            "(locked by a load, or stores still arriving?): the next cell would not start cold",
            found=found,
            deleted=deleted,
            requests=requests,
        )
    module.exit_json(changed=True, found=found, ignored=len(others), deleted=deleted, requests=requests)


def _delete(
    module: AnsibleModule, keys: list[dict[str, object]], found: int, deleted: int
) -> dict[str, object]:
    """One batch, failing the task on an error answer."""
    url = module.params["url"]
    try:
        answer = delete_keys(url, keys, module.params["timeout"])
    except urllib.error.HTTPError as exc:
        module.fail_json(
            msg=f"DELETE {url}/cache/objects answered HTTP {exc.code}: "
            f"{exc.read()[:300].decode(errors='replace')}",
            found=found,
            deleted=deleted,
        )
    except (OSError, ValueError) as exc:
        module.fail_json(msg=f"DELETE {url}/cache/objects: {exc}", found=found, deleted=deleted)
    if answer.get("ok") is False:
        module.fail_json(
            msg=f"the server could not delete L2 objects: {answer.get('error')}", found=found, deleted=deleted
        )
    return answer


if __name__ == "__main__":
    main()
