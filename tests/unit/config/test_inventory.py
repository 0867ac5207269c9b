"""Inventory parsing: groups, variable precedence, and the typed host variables the roles share."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from kvoffload.config import ConfigError, load_inventory

Writer = Callable[[str, Any], Path]


@pytest.fixture
def inventory(multi_host_inventory: dict[str, Any]) -> dict[str, Any]:
    """Parsing is layout-free: two GPU hosts exercise groups and variable precedence."""
    return multi_host_inventory


def test_groups_addresses_and_host_vars(write_yaml: Writer, inventory: Any) -> None:
    inv = load_inventory(write_yaml("hosts.yml", inventory))
    assert [h.name for h in inv.hosts] == ["h1", "h2", "h3"]
    assert inv.host("h1").groups == {"lb", "client"}
    assert inv.host("h2").groups == {"vllm", "lmcache"}
    assert inv.host("h2").address == "10.0.0.2"
    assert [d.device for d in inv.host("h2").nvme_devices] == ["/dev/loop0"]
    assert [(r.index, r.gpus) for r in inv.host("h3").replicas] == [(0, "0")]
    assert [h.name for h in inv.group("vllm")] == ["h2", "h3"]


def test_folder_means_its_hosts_yml(write_yaml: Writer, inventory: Any) -> None:
    path = write_yaml("hosts.yml", inventory)
    assert load_inventory(path.parent).file == str(path)


def test_group_vars_apply_and_host_vars_win(write_yaml: Writer, inventory: Any) -> None:
    del inventory["all"]["hosts"]["h3"]["vllm_replicas"]
    inventory["all"]["children"]["vllm"]["vars"] = {"vllm_replicas": [{"index": 0, "gpus": "0,1"}]}
    inv = load_inventory(write_yaml("hosts.yml", inventory))
    assert inv.host("h3").replicas[0].gpus == "0,1"
    assert inv.host("h2").replicas[0].gpus == "0"


def test_nested_children_and_top_level_groups(write_yaml: Writer) -> None:
    data = {
        "all": {"hosts": {"a": {"ansible_host": "10.1.0.1"}}},
        "gpus": {"children": {"vllm": {"hosts": {"b": {"vllm_replicas": [{"index": 1, "gpus": "3"}]}}}}},
    }
    inv = load_inventory(write_yaml("hosts.yml", data))
    assert inv.host("b").groups == {"gpus", "vllm"}
    assert inv.host("b").address == "b"
    assert inv.host("a").groups == frozenset()


@pytest.mark.parametrize(
    ("mutate", "key", "words"),
    [
        (
            lambda inv: inv["all"]["children"]["vllm"].update({"host": {"h9": None}}),
            "all.children.vllm.host",
            "unknown key; did you mean 'hosts'? (allowed: children, hosts, vars)",
        ),
        (
            lambda inv: inv["all"]["hosts"]["h2"]["vllm_replicas"][0].update({"gpus": "0,,1"}),
            "all.hosts.h2.vllm_replicas[0].gpus",
            "comma list of GPU ids",
        ),
        (
            lambda inv: inv["all"]["hosts"]["h2"]["vllm_replicas"][0].update({"gpus": 0}),
            "all.hosts.h2.vllm_replicas[0].gpus",
            "Input should be a valid string",
        ),
        (
            lambda inv: inv["all"]["hosts"]["h2"]["vllm_replicas"].append({"index": 0, "gpus": "1"}),
            "all.hosts.h2.vllm_replicas[1].index",
            "index 0 is used twice on this host",
        ),
        (
            lambda inv: inv["all"]["hosts"]["h2"]["vllm_replicas"].append({"index": 1, "gpus": "1,0"}),
            "all.hosts.h2.vllm_replicas[1].gpus",
            "GPU 0 is also given to vllm_replicas[0]: replicas of one machine cannot share a GPU; give each "
            "replica GPUs of its own",
        ),
        (
            lambda inv: inv["all"]["hosts"]["h2"]["nvme_storage_devices"][0].update({"fstype": "btrfs"}),
            "all.hosts.h2.nvme_storage_devices[0].fstype",
            "must be xfs or ext4",
        ),
        (
            lambda inv: inv["all"]["hosts"]["h2"]["nvme_storage_devices"][0].pop("mount"),
            "all.hosts.h2.nvme_storage_devices[0].mount",
            "required key is missing",
        ),
        (
            lambda inv: inv["all"]["children"]["vllm"].update({"vars": {"vllm_replicas": {"index": 0}}}),
            "all.children.vllm.vars.vllm_replicas",
            "valid list",
        ),
    ],
)
def test_bad_inventory_names_the_key(
    write_yaml: Writer, inventory: Any, mutate: Callable[[Any], None], key: str, words: str
) -> None:
    mutate(inventory)
    path = write_yaml("hosts.yml", inventory)
    with pytest.raises(ConfigError) as info:
        load_inventory(path)
    assert len(info.value.problems) == 1, info.value.problems
    assert info.value.problems[0].startswith(f"{path}: {key}: ")
    assert words in info.value.problems[0]


def test_invalid_yaml_names_line_and_column(tmp_path: Path) -> None:
    path = tmp_path / "hosts.yml"
    path.write_text("all:\n  hosts:\n    h1: {ansible_host: [\n")
    with pytest.raises(ConfigError) as info:
        load_inventory(path)
    assert str(info.value).startswith(f"{path}:4:1: invalid YAML")


def test_missing_file(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match=r"nope\.yml: cannot read: No such file"):
        load_inventory(tmp_path / "nope.yml")


def test_not_a_mapping(tmp_path: Path) -> None:
    path = tmp_path / "hosts.yml"
    path.write_text("- a\n- b\n")
    with pytest.raises(ConfigError, match="must be a mapping with `all`"):
        load_inventory(path)


def test_group_vars_and_host_vars_folders(write_yaml: Writer, inventory: Any, tmp_path: Path) -> None:
    del inventory["all"]["hosts"]["h3"]["vllm_replicas"]
    path = write_yaml("hosts.yml", inventory)
    (tmp_path / "group_vars").mkdir()
    (tmp_path / "group_vars" / "vllm.yml").write_text('vllm_replicas: [{index: 0, gpus: "0,1"}]\n')
    (tmp_path / "group_vars" / "all").mkdir()
    (tmp_path / "group_vars" / "all" / "campaign.yml").write_text("kvoffload_campaign: {name: x}\n")
    (tmp_path / "host_vars").mkdir()
    (tmp_path / "host_vars" / "h2.yaml").write_text('vllm_replicas: [{index: 3, gpus: "7"}]\n')
    inv = load_inventory(path)
    assert [(r.index, r.gpus) for r in inv.host("h3").replicas] == [(0, "0,1")]
    assert [(r.index, r.gpus) for r in inv.host("h2").replicas] == [(3, "7")]
    assert inv.all_vars["kvoffload_campaign"] == {"name": "x"}


def test_problem_in_a_group_vars_file_names_that_file(
    write_yaml: Writer, inventory: Any, tmp_path: Path
) -> None:
    path = write_yaml("hosts.yml", inventory)
    (tmp_path / "group_vars").mkdir()
    bad = tmp_path / "group_vars" / "vllm.yml"
    bad.write_text('vllm_replicas: [{index: 0, gpus: "a"}]\n')
    with pytest.raises(ConfigError) as info:
        load_inventory(path)
    assert info.value.problems[0].startswith(f"{bad}: vllm_replicas[0].gpus: must be a comma list")


def test_host_ranges_expand_as_ansible_does(write_yaml: Writer) -> None:
    data = {
        "all": {
            "hosts": {"client01": {"ansible_host": "10.0.0.9"}},
            "children": {
                "vllm": {
                    "vars": {"vllm_replicas": [{"index": 0, "gpus": "0"}]},
                    "hosts": {"gpu[01:02].lab.example": None},
                }
            },
        }
    }
    inv = load_inventory(write_yaml("hosts.yml", data))
    assert [h.name for h in inv.group("vllm")] == ["gpu01.lab.example", "gpu02.lab.example"]
    assert inv.host("gpu02.lab.example").address == "gpu02.lab.example"
    assert [(r.index, r.gpus) for r in inv.host("gpu01.lab.example").replicas] == [(0, "0")]


def test_an_ini_inventory_reads_like_its_yaml_twin(tmp_path: Path) -> None:
    path = tmp_path / "hosts.ini"
    path.write_text(
        "[vllm]\n"
        'gpu[01:02] vllm_replicas=\'[{"index": 0, "gpus": "0,1"}]\'\n'
        "[lmcache]\ngpu01\n"
        "[client]\nc1 ansible_host=10.0.0.9 ansible_port=2222\n"
        "[gpus:children]\nvllm\n"
        "[all:vars]\nansible_user=root\nkvoffload_wheelhouse=/srv/wh\n"
    )
    inv = load_inventory(path)
    assert [h.name for h in inv.hosts] == ["gpu01", "gpu02", "c1"]
    assert inv.host("gpu01").groups == {"vllm", "lmcache", "gpus"}
    assert inv.host("gpu02").groups == {"vllm", "gpus"}
    assert [(r.index, r.gpus) for r in inv.host("gpu02").replicas] == [(0, "0,1")]
    assert inv.host("c1").address == "10.0.0.9" and inv.host("c1").vars.ansible_port == 2222
    assert inv.all_vars == {"ansible_user": "root", "kvoffload_wheelhouse": "/srv/wh"}


def test_a_bad_value_in_an_ini_inventory_names_file_host_and_key(tmp_path: Path) -> None:
    path = tmp_path / "hosts"
    path.write_text('[vllm]\ngpu01 vllm_replicas=\'[{"index": 0, "gpus": "a"}]\'\n')
    with pytest.raises(ConfigError) as info:
        load_inventory(path)
    assert info.value.problems == [
        f'{path}: host gpu01.vllm_replicas[0].gpus: must be a comma list of GPU ids such as "0" or "0,1", '
        "got 'a'"
    ]


def test_an_ini_inventory_ansible_refuses_shows_ansibles_message(tmp_path: Path) -> None:
    path = tmp_path / "hosts.ini"
    path.write_text("[vllm]\ngpu01 novalue\n")
    with pytest.raises(ConfigError) as info:
        load_inventory(path)
    (problem,) = info.value.problems
    assert problem.startswith(f"{path}: Ansible's ini inventory plugin cannot read it: ")
    assert "Expected key=value host variable assignment, got: novalue" in problem


def test_variable_precedence_is_ansibles(write_yaml: Writer, tmp_path: Path) -> None:
    """Inline group vars of every group come before any group_vars file (Ansible's VariableManager),
    so a parent's group_vars file beats a child's inline vars; host_vars beat everything."""
    data = {
        "all": {
            "vars": {"vllm_replicas": [{"index": 9, "gpus": "9"}]},
            "children": {
                "gpus": {
                    "children": {
                        "vllm": {
                            "vars": {"vllm_replicas": [{"index": 1, "gpus": "1"}]},
                            "hosts": {"g1": None, "g2": None, "g3": None},
                        }
                    }
                }
            },
        }
    }
    path = write_yaml("hosts.yml", data)
    (tmp_path / "group_vars").mkdir()
    (tmp_path / "group_vars" / "gpus.yml").write_text('vllm_replicas: [{index: 2, gpus: "2"}]\n')
    (tmp_path / "host_vars" / "g3").mkdir(parents=True)
    (tmp_path / "host_vars" / "g3" / "a.yml").write_text('vllm_replicas: [{index: 3, gpus: "3"}]\n')
    (tmp_path / "host_vars" / "g2.yml").write_text("ansible_host: 10.0.0.2\n")
    inv = load_inventory(path)
    assert [r.index for r in inv.host("g1").replicas] == [2]
    assert [r.index for r in inv.host("g2").replicas] == [2] and inv.host("g2").address == "10.0.0.2"
    assert [r.index for r in inv.host("g3").replicas] == [3]
    assert inv.host("g1").groups == {"gpus", "vllm"}


def test_group_vars_beside_an_ini_inventory(tmp_path: Path) -> None:
    path = tmp_path / "hosts"
    path.write_text('[vllm]\ngpu01 vllm_replicas=\'[{"index": 0, "gpus": "0"}]\'\n[all:vars]\nx=1\n')
    (tmp_path / "group_vars").mkdir()
    (tmp_path / "group_vars" / "vllm.yml").write_text('vllm_replicas: [{index: 4, gpus: "4"}]\n')
    (tmp_path / "group_vars" / "all.yml").write_text("kvoffload_campaign: {name: c}\n")
    inv = load_inventory(path)
    # the host's own inline vars beat its group's file
    assert [r.index for r in inv.host("gpu01").replicas] == [0]
    assert inv.all_vars == {"x": 1, "kvoffload_campaign": {"name": "c"}}
    assert inv.all_var_sources["kvoffload_campaign"] == (
        str(tmp_path / "group_vars" / "all.yml"),
        "kvoffload_campaign",
    )


def test_merged_variables_equal_ansibles_variable_manager(write_yaml: Writer, tmp_path: Path) -> None:
    """The same inventory through Ansible's own VariableManager gives every host the same values."""
    from ansible.inventory.manager import InventoryManager
    from ansible.parsing.dataloader import DataLoader
    from ansible.vars.manager import VariableManager

    data = {
        "all": {
            "vars": {"ansible_user": "root", "x": "all"},
            "hosts": {"c1": {"ansible_host": "10.0.0.9"}},
            "children": {
                "gpus": {
                    "vars": {"x": "gpus", "y": "gpus"},
                    "children": {
                        "vllm": {
                            "vars": {"x": "vllm", "vllm_replicas": [{"index": 1, "gpus": "1"}]},
                            "hosts": {"g[1:3]": None},
                        }
                    },
                },
                "lmcache": {"vars": {"y": "lmcache"}, "hosts": {"g1": {"x": "g1-inline"}}},
            },
        }
    }
    path = write_yaml("hosts.yml", data)
    (tmp_path / "group_vars").mkdir()
    (tmp_path / "group_vars" / "gpus.yml").write_text('vllm_replicas: [{index: 2, gpus: "2"}]\nz: gpus\n')
    (tmp_path / "group_vars" / "all.yml").write_text("z: all\n")
    (tmp_path / "host_vars").mkdir()
    (tmp_path / "host_vars" / "g3.yml").write_text("x: g3-file\n")
    ours = load_inventory(path)
    loader = DataLoader()
    manager = InventoryManager(loader=loader, sources=[str(path)])
    variables = VariableManager(loader=loader, inventory=manager)
    assert [h.name for h in ours.hosts] == [h.name for h in manager.get_hosts()]
    for host in manager.get_hosts():
        theirs = variables.get_vars(host=host, include_hostvars=False)
        mine = ours.host(host.name)
        assert mine.groups == set(theirs["group_names"]) - {"ungrouped"}, host.name
        for key in ("ansible_user", "ansible_host", "x", "y", "z", "vllm_replicas"):
            got = mine.vars.model_dump(mode="json", exclude_none=True).get(key)
            want = theirs.get(key)
            assert got == (want if want is None else json.loads(json.dumps(want))), (host.name, key)
