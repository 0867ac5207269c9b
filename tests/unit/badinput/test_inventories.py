"""Malformed inventories: `plan` and `run` exit 2 naming the file and the key (or the line), with no
traceback, nothing written under --results and no host touched. Each case breaks one thing of the
valid lab of `labs.py` (the example inventory with a campaign file beside it).
"""

from __future__ import annotations

from typing import Any

import pytest

from kvoffload.config import load_lab
from tests.unit.badinput.harness import Touched, cli, install_traps
from tests.unit.badinput.labs import CLIENT, NODE, Case, Lab, assert_plan_and_run_refuse

N = f"all.hosts.{NODE}"


def _text(text: str) -> Any:
    def breaks(lab: Lab) -> None:
        lab.inventory_bytes = text.encode()

    return breaks


def _bytes(data: bytes) -> Any:
    def breaks(lab: Lab) -> None:
        lab.inventory_bytes = data

    return breaks


def _node(**values: Any) -> Any:
    def breaks(lab: Lab) -> None:
        lab.node().update(values)

    return breaks


def _replicas(*replicas: Any) -> Any:
    return _node(vllm_replicas=list(replicas))


def _nvme(*devices: Any) -> Any:
    return _node(nvme_storage_devices=list(devices))


def _drop_group(group: str) -> Any:
    def breaks(lab: Lab) -> None:
        del lab.children()[group]

    return breaks


def _second_in(group: str, host: str = "extra01.lab.example", **host_vars: Any) -> Any:
    def breaks(lab: Lab) -> None:
        lab.hosts()[host] = {"ansible_host": "192.0.2.31", **host_vars}
        lab.children()[group]["hosts"][host] = None

    return breaks


def _gpu_only(lab: Lab) -> None:
    lab.campaign["tiers"] = ["gpu"]


def _twice_listed_node(lab: Lab) -> None:
    """The node under a second name (same address, same replica index): two replicas on one port."""
    _gpu_only(lab)
    lab.hosts()["gpu01-alias"] = {"ansible_host": "192.0.2.11", "vllm_replicas": [{"index": 0, "gpus": "0"}]}
    lab.children()["vllm"]["hosts"]["gpu01-alias"] = None


def _replica_on_other_node(lab: Lab) -> None:
    lab.hosts()["gpu02.lab.example"] = {
        "ansible_host": "192.0.2.12",
        "vllm_replicas": [{"index": 0, "gpus": "0"}],
    }
    lab.children()["vllm"]["hosts"]["gpu02.lab.example"] = None


def _second_node_with_caddy_on_the_client(lab: Lab) -> None:
    lab.hosts()["gpu02.lab.example"] = {
        "ansible_host": "192.0.2.12",
        "vllm_replicas": [{"index": 0, "gpus": "0"}, {"index": 1, "gpus": "1"}],
        "nvme_storage_devices": [{"device": "/dev/nvme1n1", "mount": "/mnt/kvoffload-nvme"}],
    }
    for group in ("vllm", "lmcache"):
        lab.children()[group]["hosts"]["gpu02.lab.example"] = None
    lab.children()["lb"]["hosts"]["client01.lab.example"] = None


def _file(name: str, text: str) -> Any:
    return _bytes_file(name, text.encode())


def _bytes_file(name: str, data: bytes) -> Any:
    def breaks(lab: Lab) -> None:
        lab.extra[name] = data

    return breaks


def _args(*argv: str) -> Any:
    def breaks(lab: Lab) -> None:
        lab.argv = [*argv, "--campaign", "{camp}"]

    return breaks


VALID = "all:\n  hosts:\n    gpu01: {ansible_host: 192.0.2.11}\n"

CASES = [
    # Files that are not YAML, or not an inventory at all.
    Case(
        "yaml-unclosed-flow", _text(VALID + "    client01: {ansible_host: [\n"), ("{inv}:5:1: invalid YAML",)
    ),
    Case("yaml-tab-indent", _text("all:\n\thosts: {}\n"), ("{inv}:2:1: invalid YAML", "'\\t'")),
    Case("yaml-mapping-in-scalar", _text("all:\n  hosts: a: b\n"), ("{inv}:2:11: invalid YAML",)),
    Case(
        "yaml-unclosed-quote", _text('all:\n  vars:\n    ansible_user: "root\n'), ("{inv}:4:1: invalid YAML",)
    ),
    Case("yaml-bad-dedent", _text("all:\n    hosts: {}\n  vars: {}\n"), ("{inv}:3:3: invalid YAML",)),
    Case("empty-file", _text(""), ("{inv}: (top level): an Ansible YAML inventory must be a mapping",)),
    Case("only-comments", _text("# nothing here\n"), ("{inv}: (top level): an Ansible YAML inventory",)),
    Case(
        "binary-garbage", _bytes(b"all:\n  \xff\xfe\x00\x81garbage"), ("{inv}:2: not UTF-8 text (byte 0xff)",)
    ),
    Case(
        "control-characters",
        _bytes(b"all:\n  hosts:\x00\x07\n"),
        ("{inv}:2: invalid YAML: unacceptable character",),
    ),
    Case("top-level-list", _text("- all\n- hosts\n"), ("{inv}: (top level): an Ansible YAML inventory",)),
    Case("top-level-scalar", _text("just a string\n"), ("{inv}: (top level): an Ansible YAML inventory",)),
    Case(
        "all-is-a-list",
        _text("all: [gpu01, client01]\n"),
        ("{inv}: all: must be a mapping with keys children, hosts, vars",),
    ),
    Case(
        "all-is-a-list-beside-a-group",
        _text("all: [a]\nvllm: {hosts: {a: null}}\n"),
        ("{inv}: all: must be a mapping",),
    ),
    Case(
        "children-is-a-list-beside-a-group",
        _text("all: {children: [vllm]}\nclient: {hosts: {a: null}}\n"),
        ("{inv}: all.children: must be a mapping",),
    ),
    # Duplicated keys: PyYAML would keep the last silently.
    Case(
        "duplicated-host",
        _text(VALID + "    gpu01: {ansible_host: 192.0.2.12}\n"),
        ("{inv}:4:5: invalid YAML: duplicate key 'gpu01' (first written on line 3)",),
    ),
    Case(
        "duplicated-group",
        _text("all:\n  children:\n    vllm: {hosts: {a: null}}\n    vllm: {hosts: {b: null}}\n"),
        ("{inv}:4:5: invalid YAML: duplicate key 'vllm'",),
    ),
    Case(
        "duplicated-host-var",
        _text("all:\n  hosts:\n    a:\n      ansible_host: 192.0.2.1\n      ansible_host: 192.0.2.2\n"),
        ("{inv}:5:7: invalid YAML: duplicate key 'ansible_host' (first written on line 4)",),
    ),
    # Structure: unknown keys and wrong types.
    Case(
        "unknown-key-in-all",
        lambda lab: lab.inventory["all"].update(host={}),
        ("{inv}: all.host: unknown key; did you mean 'hosts'? (allowed: children, hosts, vars)",),
    ),
    Case(
        "unknown-key-in-group",
        lambda lab: lab.children()["vllm"].update(hots={}),
        ("{inv}: all.children.vllm.hots: unknown key; did you mean 'hosts'? (allowed: children,",),
    ),
    Case(
        "hosts-is-a-list",
        lambda lab: lab.inventory["all"].update(hosts=[NODE, CLIENT]),
        ("{inv}: all.hosts: Input should be a valid dictionary",),
    ),
    Case(
        "host-vars-is-a-string",
        lambda lab: lab.hosts().update({CLIENT: "192.0.2.21"}),
        (f"{{inv}}: all.hosts.{CLIENT}: Input should be a valid dictionary",),
    ),
    Case(
        "group-is-a-scalar",
        lambda lab: lab.children().update(lb=3),
        ("{inv}: all.children.lb: must be a mapping with keys children, hosts, vars, got 3",),
    ),
    Case(
        "vars-is-a-list",
        lambda lab: lab.inventory["all"].update(vars=["ansible_user"]),
        ("{inv}: all.vars: Input should be a valid dictionary",),
    ),
    # Groups and hosts the campaign needs.
    Case(
        "no-client-group",
        _drop_group("client"),
        ("{inv}: all.children.client: needs at least one host to replay from, has none",),
    ),
    Case(
        "client-not-in-group",
        _node(kvoffload_client="extra01.lab.example"),
        ("{inv}: host gpu01.lab.example: kvoffload_client: 'extra01.lab.example' is not in group client",),
    ),
    Case("no-vllm-group", _drop_group("vllm"), ("{inv}: all.children.vllm: needs at least one host",)),
    Case(
        "no-lmcache-group",
        _drop_group("lmcache"),
        ("{inv}: all.children.lmcache: tiers cpu, nvme", "tiers) need exactly one host in group lmcache"),
    ),
    Case(
        "two-lmcache-hosts",
        _second_in("lmcache"),
        ("{inv}: all.children.lmcache: at most one host with one node in vllm, has 2",),
    ),
    Case(
        "no-lb-group",
        _drop_group("lb"),
        ("{inv}: all.children.lb: 8 vLLM replicas need one host in group lb",),
    ),
    Case(
        "two-lb-hosts", _second_in("lb"), ("{inv}: all.children.lb: at most one host with one node in vllm",)
    ),
    Case(
        "vllm-host-without-replicas",
        lambda lab: lab.node().pop("vllm_replicas"),
        (f"{{inv}}: host {NODE} (group vllm): vllm_replicas is missing or empty",),
    ),
    Case(
        "offload-replica-off-the-lmcache-host",
        _replica_on_other_node,
        (
            "{inv}: host gpu02.lab.example (group vllm): tiers cpu, nvme",
            "need every node in group lmcache (its replicas share KV with a server on the same node)",
            "{inv}: host gpu02.lab.example: nvme_storage_devices is empty",
        ),
    ),
    Case(
        "second-node-caddy-elsewhere",
        _second_node_with_caddy_on_the_client,
        (
            "{inv}: all.children.lb: client01.lab.example is not a node (group vllm)",
            "{inv}: host gpu02.lab.example (group vllm): 2 replicas need Caddy on the node: add it to group",
        ),
    ),
    Case(
        "same-node-listed-twice",
        _twice_listed_node,
        (
            "{inv}: host gpu01-alias (group vllm): vllm_replicas[0] (index 0)",
            f"same address 192.0.2.11 and port as a replica of host {NODE}",
        ),
    ),
    # vllm_replicas.
    Case(
        "replicas-is-a-mapping",
        _node(vllm_replicas={"index": 0, "gpus": "0"}),
        (f"{{inv}}: {N}.vllm_replicas: Input should be a valid list",),
    ),
    Case(
        "replica-negative-index",
        _replicas({"index": -1, "gpus": "0"}),
        (f"{{inv}}: {N}.vllm_replicas[0].index: Input should be greater than or equal to 0",),
    ),
    Case(
        "replica-index-as-string",
        _replicas({"index": "0", "gpus": "0"}),
        (f"{{inv}}: {N}.vllm_replicas[0].index: must be an integer, got '0'",),
    ),
    Case(
        "replica-gpus-as-int",
        _replicas({"index": 0, "gpus": 0}),
        (f"{{inv}}: {N}.vllm_replicas[0].gpus: Input should be a valid string, got 0",),
    ),
    Case(
        "replica-gpus-not-ids",
        _replicas({"index": 0, "gpus": "gpu0"}),
        (f"{{inv}}: {N}.vllm_replicas[0].gpus: must be a comma list of GPU ids",),
    ),
    Case(
        "replica-gpu-twice",
        _replicas({"index": 0, "gpus": "0,0"}),
        (f"{{inv}}: {N}.vllm_replicas[0].gpus: lists a GPU twice",),
    ),
    Case(
        "two-replicas-one-index",
        _replicas({"index": 0, "gpus": "0"}, {"index": 0, "gpus": "1"}),
        (f"{{inv}}: {N}.vllm_replicas[1].index: index 0 is used twice",),
    ),
    Case(
        "two-replicas-one-gpu",
        _replicas({"index": 0, "gpus": "0"}, {"index": 1, "gpus": "0"}),
        (f"{{inv}}: {N}.vllm_replicas[1].gpus: GPU 0 is also given to vllm_replicas[0]",),
    ),
    Case(
        "replica-unknown-key",
        _replicas({"index": 0, "gpus": "0", "gpu_mem": 80}),
        (f"{{inv}}: {N}.vllm_replicas[0].gpu_mem: unknown key (allowed: gpus, index)",),
    ),
    Case(
        "replica-missing-gpus",
        _replicas({"index": 0}),
        (f"{{inv}}: {N}.vllm_replicas[0].gpus: required key is missing",),
    ),
    Case(
        "replicas-bad-in-group-vars",
        lambda lab: lab.children()["vllm"].update(vars={"vllm_replicas": [{"index": 0, "gpus": "x"}]}),
        ("{inv}: all.children.vllm.vars.vllm_replicas[0].gpus: must be a comma list of GPU ids",),
    ),
    # nvme_storage_devices.
    Case(
        "nvme-tier-without-device",
        lambda lab: lab.node().pop("nvme_storage_devices"),
        (f"{{inv}}: host {NODE}: nvme_storage_devices is empty", "tiers has nvme"),
    ),
    Case(
        "nvme-devices-is-a-string",
        _node(nvme_storage_devices="/dev/nvme1n1"),
        (f"{{inv}}: {N}.nvme_storage_devices: Input should be a valid list",),
    ),
    Case(
        "nvme-device-not-in-dev",
        _nvme({"device": "nvme1n1", "mount": "/mnt/x"}),
        (f"{{inv}}: {N}.nvme_storage_devices[0].device: String should match pattern",),
    ),
    Case(
        "nvme-mount-relative",
        _nvme({"device": "/dev/nvme1n1", "mount": "mnt/x"}),
        (f"{{inv}}: {N}.nvme_storage_devices[0].mount: String should match pattern",),
    ),
    Case(
        "nvme-mount-root",
        _nvme({"device": "/dev/nvme1n1", "mount": "/"}),
        (f"{{inv}}: {N}.nvme_storage_devices[0].mount: must be a mount point of its own",),
    ),
    Case(
        "nvme-fstype-unknown",
        _nvme({"device": "/dev/nvme1n1", "mount": "/mnt/x", "fstype": "btrfs"}),
        (f"{{inv}}: {N}.nvme_storage_devices[0].fstype: must be xfs or ext4, got 'btrfs'",),
    ),
    Case(
        "nvme-wipe-as-string",
        _nvme({"device": "/dev/nvme1n1", "mount": "/mnt/x", "wipe": "yes"}),
        (f"{{inv}}: {N}.nvme_storage_devices[0].wipe: Input should be a valid boolean, got 'yes'",),
    ),
    Case(
        "nvme-unknown-key",
        _nvme({"device": "/dev/nvme1n1", "mount": "/mnt/x", "size": "1T"}),
        (f"{{inv}}: {N}.nvme_storage_devices[0].size: unknown key (allowed: device, fstype, mount, wipe)",),
    ),
    Case(
        "nvme-device-twice",
        _nvme({"device": "/dev/nvme1n1", "mount": "/mnt/a"}, {"device": "/dev/nvme1n1", "mount": "/mnt/b"}),
        (
            f"{{inv}}: {N}.nvme_storage_devices[1].device: "
            "/dev/nvme1n1 is also given to nvme_storage_devices[0]",
        ),
    ),
    Case(
        "nvme-mount-twice",
        _nvme({"device": "/dev/nvme1n1", "mount": "/mnt/a"}, {"device": "/dev/nvme2n1", "mount": "/mnt/a"}),
        (f"{{inv}}: {N}.nvme_storage_devices[1].mount: /mnt/a is also given to nvme_storage_devices[0]",),
    ),
    # Addresses and ports.
    Case(
        "address-bad-ipv4",
        _node(ansible_host="192.0.2.300"),
        (f"{{inv}}: {N}.ansible_host: '192.0.2.300' is not a valid IPv4 address",),
    ),
    Case(
        "address-with-space",
        _node(ansible_host="gpu 01"),
        (f"{{inv}}: {N}.ansible_host: must be an IPv4 address or a host name",),
    ),
    Case(
        "address-ipv6",
        _node(ansible_host="2001:db8::11"),
        (f"{{inv}}: {N}.ansible_host: '2001:db8::11': IPv6 literals are not supported",),
    ),
    Case(
        "address-as-int",
        _node(ansible_host=192),
        (f"{{inv}}: {N}.ansible_host: Input should be a valid string, got 192",),
    ),
    Case(
        "address-empty",
        _node(ansible_host=""),
        (f"{{inv}}: {N}.ansible_host: must be an IPv4 address or a host name",),
    ),
    Case(
        "port-zero", _node(ansible_port=0), (f"{{inv}}: {N}.ansible_port: must be a TCP port 1-65535, got 0",)
    ),
    Case(
        "port-too-big",
        _node(ansible_port=70000),
        (f"{{inv}}: {N}.ansible_port: must be a TCP port 1-65535, got 70000",),
    ),
    Case(
        "port-a-name",
        _node(ansible_port="ssh"),
        (f"{{inv}}: {N}.ansible_port: must be a TCP port 1-65535, got 'ssh'",),
    ),
    Case(
        "port-bad-in-all-vars",
        lambda lab: lab.inventory["all"]["vars"].update(ansible_port=-22),
        ("{inv}: all.vars.ansible_port: must be a TCP port 1-65535, got -22",),
    ),
    # group_vars/ and host_vars/ beside the inventory.
    Case(
        "group-vars-syntax-error",
        _file("group_vars/vllm.yml", "vllm_replicas: [\n"),
        ("{root}/group_vars/vllm.yml:2:1: invalid YAML",),
    ),
    Case(
        "group-vars-not-a-mapping",
        _file("group_vars/all.yml", "- ansible_user\n"),
        ("{root}/group_vars/all.yml: (top level): a vars file must be a mapping",),
    ),
    Case(
        "host-vars-bad-replicas",
        _file(f"host_vars/{NODE}.yml", "vllm_replicas: [{index: 0, gpus: 'zero'}]\n"),
        (f"{{root}}/host_vars/{NODE}.yml: vllm_replicas[0].gpus: must be a comma list",),
    ),
    Case(
        "host-vars-not-utf8",
        _bytes_file(f"host_vars/{CLIENT}.yml", b"ansible_host: \xc3\x28\n"),
        (f"{{root}}/host_vars/{CLIENT}.yml:1: not UTF-8 text (byte 0xc3)",),
    ),
    # The inventory argument itself.
    Case(
        "inventory-missing",
        _args("{inv}.missing"),
        ("{inv}.missing: cannot read: No such file or directory",),
    ),
    Case("inventory-folder-without-hosts-yml", _args("{data}"), ("{data}/hosts.yml: cannot read",)),
]


def test_the_base_lab_is_valid(tmp_path: Any) -> None:
    """The corpus breaks one thing of a lab that plans: without this, a case could pass for another
    reason than the one it names."""
    lab = Lab(tmp_path, inline=False)
    args = lab.write()
    loaded = load_lab(args[0], args[2])
    assert [h.address for h in loaded.inventory.hosts] == ["192.0.2.11", "192.0.2.21", "192.0.2.22"]
    assert len(loaded.cells) == 3 and len(loaded.replicas) == 8


def test_the_traps_catch_a_run_that_reaches_for_the_lab(
    tmp_path: Any, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """A valid lab gets past every check: `run` then builds the hosts' wheels (pip, a child process)
    before its first playbook, and the traps stop it there. So a bad case that slipped through would
    fail its test instead of reaching 192.0.2.x."""
    lab = Lab(tmp_path, inline=False)
    args = lab.write()
    touched = install_traps(monkeypatch)
    with pytest.raises(Touched):
        cli(
            ["run", *args, "--results", str(tmp_path / "results"), "--wheel-cache", str(tmp_path / "w")],
            capsys,
        )
    assert touched and touched[0] == "Popen.__init__"


@pytest.mark.parametrize("case", [pytest.param(c, id=c.id) for c in CASES])
def test_malformed_inventory_is_refused(
    case: Case, tmp_path: Any, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    lab = Lab(tmp_path, inline=False)
    case.breaks(lab)
    assert_plan_and_run_refuse(lab, case.needles, capsys, monkeypatch)


def test_the_corpus_is_large_enough() -> None:
    assert len(CASES) >= 50
    assert len({c.id for c in CASES}) == len(CASES)


def test_ansible_vault_values_are_not_bad_input(tmp_path: Any) -> None:
    """The HF token may sit in the inventory as an ansible-vault value, inline (`!vault |`) or as a
    vars file encrypted whole: both are Ansible's to decrypt, so validation passes them through."""
    lab = Lab(tmp_path, inline=False)
    lab.extra["group_vars/vllm.yml"] = b"vllm_hf_token: !vault |\n  $ANSIBLE_VAULT;1.1;AES256\n  66386439\n"
    lab.extra["group_vars/all/vault.yml"] = b"$ANSIBLE_VAULT;1.1;AES256\n6638643965323633\n"
    args = lab.write()
    node = load_lab(args[0], args[2]).inventory.host(NODE)
    assert (node.vars.model_extra or {})["vllm_hf_token"] == "$ANSIBLE_VAULT;1.1;AES256\n66386439\n"
