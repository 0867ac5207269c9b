#!/usr/bin/python3
"""Ansible module: write several small files (rendered on the controller) in one module run.

Of the kvoffload.lab collection, called in every cell's deploy by the vllm role (one environment file
per replica) and lmcache_server (its environment file and unit). A `template` task costs three round
trips to the host per file (a stat, the transfer, the copy module): about 0.9 s per changed file on
the 2-core lab machine, 4 s of a two-replica cell's deploy. Here the contents travel in the module's
arguments (templated by the task, on the controller, as the template action does) and every file is
compared and written in one run.

A file is written only when its bytes differ, through a temporary file in the same folder that gets
the owner, group and mode first and then replaces it (a reader never sees half a file, a service never
a file it may not read); owner, group or mode alone are corrected in place. The parent folder must
exist (the roles create it at install). Check mode reports what would change and writes nothing; with
--diff each changed file's before and after come back, as from `template`. Standard library only: it
runs on the host's own python3.
"""

from __future__ import annotations

import grp
import os
import pwd
import stat
import tempfile
from pathlib import Path

from ansible.module_utils.basic import AnsibleModule

DOCUMENTATION = r"""
module: kvoffload_files
short_description: Write several small files from their contents in one module run
version_added: "0.1.0"
author: kvoffload-lab
description:
  - Writes each of I(files) whose content, owner, group or mode differ, atomically, and says which.
  - The parent folder of each file must exist. Check mode reports what would change; with --diff each
    changed file's before and after come back.
options:
  files:
    type: list
    elements: dict
    required: true
    description: The files to have, each with its content, owner, group and mode.
    suboptions:
      path: {type: path, required: true, description: Where the file is.}
      content: {type: str, required: true, description: Its whole content.}
      owner: {type: str, default: root, description: Owner's user name.}
      group: {type: str, default: root, description: Group name.}
      mode: {type: str, default: "0644", description: Mode as an octal string.}
"""

EXAMPLES = r"""
- name: Write the LMCache server's environment file and unit in one run
  kvoffload.lab.kvoffload_files:
    files:
      - path: /etc/kvoffload/lmcache.env
        content: "{{ lookup('ansible.builtin.template', 'etc/kvoffload/lmcache.env.j2') }}"
        owner: root
        group: kvoffload
        mode: "0640"
      - path: /etc/systemd/system/kvoffload-lmcache.service
        content: "{{ lookup('ansible.builtin.template', 'etc/systemd/system/kvoffload-lmcache.service.j2') }}"
  register: lmcache_files

- name: Reload systemd only when the unit changed
  ansible.builtin.systemd_service:
    daemon_reload: true
  when: "'/etc/systemd/system/kvoffload-lmcache.service' in lmcache_files.changed_paths"
"""

RETURN = r"""
changed_paths:
  description: The files written or corrected (would be, in check mode), in the order given.
  type: list
  elements: str
  returned: always
"""


def _ids(spec: dict[str, str]) -> tuple[int, int] | None:
    """The uid and gid of the file's owner and group; None when either does not exist."""
    try:
        return pwd.getpwnam(spec["owner"]).pw_uid, grp.getgrnam(spec["group"]).gr_gid
    except KeyError:
        return None


def needs(path: str, content: bytes, uid: int, gid: int, mode: int) -> tuple[str | None, bytes]:
    """('content' when the file is missing or its bytes differ, 'attributes' when only its owner, group
    or mode do, None when it is as wanted; the bytes it holds now, empty when missing)."""
    try:
        st = Path(path).stat()
        current = Path(path).read_bytes()
    except FileNotFoundError:
        return "content", b""
    if current != content:
        return "content", current
    if (st.st_uid, st.st_gid, stat.S_IMODE(st.st_mode)) != (uid, gid, mode):
        return "attributes", current
    return None, current


def write(path: str, content: bytes, uid: int, gid: int, mode: int) -> None:
    """`content` at `path`, with its owner, group and mode set before it replaces the old file."""
    folder, name = os.path.split(path)
    fd, tmp = tempfile.mkstemp(dir=folder, prefix=f".{name}.")
    try:
        with os.fdopen(fd, "wb") as handle:
            handle.write(content)
            os.fchown(handle.fileno(), uid, gid)
            os.fchmod(handle.fileno(), mode)
        Path(tmp).replace(path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def main() -> None:
    module = AnsibleModule(
        argument_spec={
            "files": {
                "type": "list",
                "elements": "dict",
                "required": True,
                "options": {
                    "path": {"type": "path", "required": True},
                    "content": {"type": "str", "required": True},
                    "owner": {"type": "str", "default": "root"},
                    "group": {"type": "str", "default": "root"},
                    "mode": {"type": "str", "default": "0644"},
                },
            }
        },
        supports_check_mode=True,
    )
    changed: list[str] = []
    diffs: list[dict[str, str]] = []
    for spec in module.params["files"]:
        path = spec["path"]
        try:
            mode = int(spec["mode"], 8)
        except ValueError:
            module.fail_json(msg=f"{path}: mode {spec['mode']!r} is not an octal number such as '0640'")
        ids = _ids(spec)
        folder_exists = Path(path).parent.is_dir()
        if not folder_exists or ids is None:
            # in --check on a fresh host the install that makes them only said it would
            if not module.check_mode:
                module.fail_json(
                    msg=f"{path}: its folder does not exist (the role's install creates it)"
                    if not folder_exists
                    else f"{path}: owner {spec['owner']!r} or group {spec['group']!r} does not exist "
                    "on this host"
                )
            changed.append(path)
            continue
        uid, gid = ids
        content = spec["content"].encode("utf-8")
        what, current = needs(path, content, uid, gid, mode)
        if what is None:
            continue
        changed.append(path)
        if module._diff and what == "content":
            before = current.decode("utf-8", errors="replace")
            diffs.append(
                {"before_header": path, "after_header": path, "before": before, "after": spec["content"]}
            )
        if module.check_mode:
            continue
        if what == "content":
            write(path, content, uid, gid, mode)
        else:
            os.chown(path, uid, gid)
            Path(path).chmod(mode)
    result: dict[str, object] = {"changed": bool(changed), "changed_paths": changed}
    if diffs:
        result["diff"] = diffs
    module.exit_json(**result)


if __name__ == "__main__":
    main()
