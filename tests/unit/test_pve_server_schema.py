"""The PVE test server's schema layer: route table and validator against the real API schema."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # the repo root, for pve_testserver

from pve_testserver import PVEError, Schema
from pve_testserver.core import HANDLERS, Core
from pve_testserver.formats import FormatError, check_named_format, split_list
from pve_testserver.privileges import BUILTIN_ROLES, PRIVILEGES
from pve_testserver.schema import parse_property_string, perl_regex

CT = "/nodes/{node}/lxc/{vmid}"
NET0 = "name=eth0,bridge=vmbr1,ip=10.99.1.2/16,gw=10.99.0.1"


@pytest.fixture(scope="module")
def schema() -> Schema:
    return Schema.load()


def errors_of(schema: Schema, template: str, verb: str, params: dict[str, Any]) -> dict[str, str]:
    with pytest.raises(PVEError) as exc:
        schema.method(template, verb).validate(params)
    assert exc.value.status == 400
    assert exc.value.message == "Parameter verification failed.\n"
    return exc.value.errors


def ok(schema: Schema, template: str, verb: str, params: dict[str, Any]) -> dict[str, Any]:
    return schema.method(template, verb).validate(params)


# --- loading and routing ----------------------------------------------------------------------


def test_schema_has_all_paths_and_every_pattern_compiles(schema: Schema) -> None:
    templates = schema.templates()
    assert len(templates) == 435
    assert sum(len(m) for m in templates.values()) == 649
    patterns = set()
    for methods in templates.values():
        for method in methods.values():
            stack = list(method.properties.values())
            while stack:
                sub = stack.pop()
                if "pattern" in sub:
                    patterns.add(sub["pattern"])
                if isinstance(sub.get("format"), dict):
                    stack.extend(sub["format"].values())
    assert len(patterns) > 50
    for pattern in patterns:
        perl_regex(pattern)  # raises re.error if the Perl -> Python translation is wrong


@pytest.mark.parametrize(
    ("path", "template", "uri"),
    [
        ("/version", "/version", {}),
        ("/nodes/pve/lxc/100/config", f"{CT}/config", {"node": "pve", "vmid": "100"}),
        ("/nodes/pve/lxc/100/status/current", f"{CT}/status/current", {"node": "pve", "vmid": "100"}),
        ("/nodes/pve/tasks/UPID:pve:1:2:3:x:1:r@pam:/status", "/nodes/{node}/tasks/{upid}/status", None),
        ("/pools/sandbox", "/pools/{poolid}", {"poolid": "sandbox"}),
        ("//nodes//pve/lxc/", "/nodes/{node}/lxc", {"node": "pve"}),
        (
            "/nodes/pve/lxc/100/firewall/ipset/allow/10.99.0.0/16",
            f"{CT}/firewall/ipset/{{name}}/{{cidr}}",
            {"node": "pve", "vmid": "100", "name": "allow", "cidr": "10.99.0.0/16"},
        ),
        (
            "/nodes/pve/storage/local/content/local:vztmpl/debian.tar.zst",
            "/nodes/{node}/storage/{storage}/content/{volume}",
            {"node": "pve", "storage": "local", "volume": "local:vztmpl/debian.tar.zst"},
        ),
    ],
)
def test_routes_match_like_pve(schema: Schema, path: str, template: str, uri: dict[str, str] | None) -> None:
    found = schema.match(path)
    assert found is not None
    assert found[0] == template
    if uri is not None:
        assert found[2] == uri


@pytest.mark.parametrize(
    "path", ["/foo", "/nodes/pve/lxc/100/bogus", "/nodes/pve/lxc/100/config/extra", "/versions"]
)
def test_unknown_paths_do_not_match(schema: Schema, path: str) -> None:
    assert schema.match(path) is None


# --- validation on real schema entries ---------------------------------------------------------


def test_every_method_reports_exactly_its_required_parameters(schema: Schema) -> None:
    """validate({}) on all 649 methods: the errors are the non-optional parameters, nothing else."""
    for template, methods in schema.templates().items():
        for verb, method in methods.items():
            required = {
                k for k, v in method.properties.items() if not v.get("optional") and not v.get("alias")
            }
            try:
                method.validate({})
                errors: dict[str, str] = {}
            except PVEError as exc:
                errors = exc.errors
            assert set(errors) == required, (verb, template)
            assert all(e == "property is missing and it is not optional" for e in errors.values())


def test_misspelt_parameter_is_rejected(schema: Schema) -> None:
    errors = errors_of(schema, f"{CT}/config", "PUT", {"node": "pve", "vmid": "100", "corez": "2"})
    assert errors == {
        "corez": "property is not defined in schema and the schema does not allow additional properties"
    }


def test_parameterless_method_rejects_unknown_parameters(schema: Schema) -> None:
    assert "foo" in errors_of(schema, "/version", "GET", {"foo": "1"})


@pytest.mark.parametrize(
    ("params", "key", "message"),
    [
        ({"cores": "two"}, "cores", "type check ('integer') failed - got 'two'"),
        ({"cores": "1.5"}, "cores", "type check ('integer') failed - got '1.5'"),
        ({"cores": "0"}, "cores", "value must have a minimum value of 1"),
        ({"cores": "9000"}, "cores", "value must have a maximum value of 8192"),
        ({"memory": "8"}, "memory", "value must have a minimum value of 16"),
        ({"arch": "amd"}, "arch", "value 'amd' does not have a value in the enumeration"),
        ({"onboot": "True"}, "onboot", "type check ('boolean') failed - got 'True'"),
        ({"onboot": "yes"}, "onboot", "type check ('boolean') failed - got 'yes'"),
        (
            {"hostname": "bad_name"},
            "hostname",
            "invalid format - value does not look like a valid DNS name\n",
        ),
        ({"tags": "ok;not ok!"}, "tags", "invalid format - invalid characters in tag\n"),
        ({"delete": "net0,1bad"}, "delete", "invalid format - invalid configuration ID '1bad'\n"),
        ({"description": "x" * 8193}, "description", "value may only be 8192 characters long"),
        ({"vmid": "99"}, "vmid", "invalid format - value does not look like a valid VM ID\n"),
        ({"node": "no_de"}, "node", "invalid format - value does not look like a valid node name\n"),
        ({"digest": "x" * 41}, "digest", "value may only be 40 characters long"),
        ({"net32": NET0}, "net32", "property is not defined in schema"),
    ],
)
def test_config_put_rejects_bad_values(
    schema: Schema, params: dict[str, Any], key: str, message: str
) -> None:
    base = {"node": "pve", "vmid": "100"}
    errors = errors_of(schema, f"{CT}/config", "PUT", {**base, **params})
    assert key in errors
    assert errors[key].startswith(message)


def test_booleans_take_0_1_and_json_booleans(schema: Schema) -> None:
    base = {"node": "pve", "vmid": "100"}
    assert ok(schema, f"{CT}/config", "PUT", {**base, "onboot": "1"})["onboot"] is True
    assert ok(schema, f"{CT}/config", "PUT", {**base, "onboot": "0"})["onboot"] is False
    assert ok(schema, f"{CT}/config", "PUT", {**base, "onboot": True})["onboot"] is True
    errors = errors_of(schema, f"{CT}/config", "PUT", {**base, "cores": True})
    assert errors["cores"] == "type check ('integer') failed - got JSON::PP::Boolean"


def test_indexed_parameters_map_to_numbered_names(schema: Schema) -> None:
    base = {"node": "pve", "vmid": "100"}
    typed = ok(
        schema, f"{CT}/config", "PUT", {**base, "net0": NET0, "net31": NET0, "mp255": "local:8,mp=/mnt"}
    )
    assert typed["vmid"] == 100 and typed["net31"] == NET0
    assert "mp256" in errors_of(schema, f"{CT}/config", "PUT", {**base, "mp256": "local:8,mp=/mnt"})
    qemu = "/nodes/{node}/qemu/{vmid}/config"
    assert ok(schema, qemu, "PUT", {**base, "scsi30": "local-lvm:8"})
    assert "scsi31" in errors_of(schema, qemu, "PUT", {**base, "scsi31": "local-lvm:8"})
    assert "ide4" in errors_of(schema, qemu, "PUT", {**base, "ide4": "local-lvm:8"})


@pytest.mark.parametrize(
    ("net0", "needle"),
    [
        (
            "name=eth0,bridge=vmbr1,ip=10.99.1.2/99",
            "net0.ip: invalid format - value does not look like a valid ipv4",
        ),
        (
            "name=eth0,ip=10.99.1.2/16,gw=10.99.0.999",
            "net0.gw: invalid format - value does not look like a valid IPv4",
        ),
        ("bridge=vmbr1", "net0.name: property is missing and it is not optional"),
        ("name=eth0,colour=red", "invalid key in comma-separated list property: colour"),
        ("name=eth0,name=eth1", "duplicate key in comma-separated list property: name"),
        ("eth0", "value without key, but schema does not define a default key"),
        ("name=eth0,tag=5000", "net0.tag: value must have a maximum value of 4094"),
        ("name=eth0,firewall=maybe", "net0.firewall: type check ('boolean') failed - got 'maybe'"),
        (
            "name=eth0,hwaddr=01:00:00:00:00:01",
            "net0.hwaddr: invalid format - value does not look like a valid unicast MAC",
        ),
        ("name=eth0,ip=", "missing key in comma-separated list property"),
    ],
)
def test_property_strings_are_checked(schema: Schema, net0: str, needle: str) -> None:
    errors = errors_of(schema, f"{CT}/config", "PUT", {"node": "pve", "vmid": "100", "net0": net0})
    assert errors["net0"].startswith("invalid format - ")
    assert needle in errors["net0"]


def test_property_strings_accept_pve_spellings(schema: Schema) -> None:
    fmt = schema.method(f"{CT}/config", "PUT").properties["net0"]["format"]
    parsed = parse_property_string(
        fmt, "name=eth0,bridge=vmbr1,firewall=yes,ip=dhcp,ip6=auto,rate=1.5", "net0"
    )
    assert parsed["firewall"] == "1" and parsed["ip6"] == "auto"
    rootfs = schema.method(f"{CT}/config", "PUT").properties["rootfs"]["format"]
    assert (
        parse_property_string(rootfs, "local-lvm:vm-100-disk-0,size=8G", "rootfs")["volume"]
        == "local-lvm:vm-100-disk-0"
    )


def test_clone_requires_newid_and_checks_its_format(schema: Schema) -> None:
    template = f"{CT}/clone"
    assert errors_of(schema, template, "POST", {"node": "pve", "vmid": "9000"}) == {
        "newid": "property is missing and it is not optional"
    }
    errors = errors_of(
        schema, template, "POST", {"node": "pve", "vmid": "9000", "newid": "101", "full": "true"}
    )
    assert errors == {"full": "type check ('boolean') failed - got 'true'"}
    errors = errors_of(
        schema, template, "POST", {"node": "pve", "vmid": "9000", "newid": "101", "pool": "a b"}
    )
    assert errors["pool"] == "invalid format - pool name 'a b' contains invalid characters\n"
    typed = ok(schema, template, "POST", {"node": "pve", "vmid": "9000", "newid": "101", "hostname": "sbx-1"})
    assert typed == {"node": "pve", "vmid": 9000, "newid": 101, "hostname": "sbx-1"}


def test_requires_and_patterns(schema: Schema) -> None:
    assert errors_of(schema, "/pools", "GET", {"type": "lxc"}) == {
        "poolid": "missing property required by 'type'"
    }
    ipset = f"{CT}/firewall/ipset"
    errors = errors_of(schema, ipset, "POST", {"node": "pve", "vmid": "100", "name": "1set"})
    assert errors == {"name": "value does not match the regex pattern"}
    token = "/access/users/{userid}/token/{tokenid}"
    errors = errors_of(schema, token, "POST", {"userid": "sbx@pve", "tokenid": "bad token"})
    assert errors == {"tokenid": "value does not match the regex pattern"}
    errors = errors_of(schema, token, "POST", {"userid": "sbx", "tokenid": "t1"})
    assert errors["userid"] == "invalid format - value 'sbx' does not look like a valid user name\n"


def test_list_formats_and_legacy_array_normalisation(schema: Schema) -> None:
    acl = "/access/acl"
    typed = ok(
        schema, acl, "PUT", {"path": "/vms", "roles": ["PVEVMAdmin", "PVEAuditor"], "tokens": "a@pve!t1"}
    )
    assert typed["roles"] == "PVEVMAdmin,PVEAuditor"
    errors = errors_of(schema, acl, "PUT", {"path": "/", "roles": "PVEAdmin", "users": "nobody"})
    assert errors["users"].startswith("invalid format - value 'nobody' does not look like a valid user name")
    errors = errors_of(schema, "/pools", "PUT", {"poolid": "p", "vms": "100,abc"})
    assert errors["vms"] == "invalid format - value does not look like a valid VM ID\n"


def test_firewall_formats(schema: Schema) -> None:
    rules = f"{CT}/firewall/rules"
    base = {"node": "pve", "vmid": "100", "type": "in", "action": "ACCEPT"}
    assert ok(schema, rules, "POST", {**base, "dport": "22,80:90", "proto": "tcp", "source": "10.99.0.0/16"})
    assert "dport" in errors_of(schema, rules, "POST", {**base, "dport": "70000"})
    assert "proto" in errors_of(schema, rules, "POST", {**base, "proto": "nosuchproto"})
    assert "source" in errors_of(schema, rules, "POST", {**base, "source": "10.0.0.1,fd00::1"})
    cidr = f"{CT}/firewall/ipset/{{name}}"
    assert ok(schema, cidr, "POST", {"node": "pve", "vmid": "100", "name": "allow", "cidr": "10.99.1.2"})
    assert "cidr" in errors_of(
        schema, cidr, "POST", {"node": "pve", "vmid": "100", "name": "allow", "cidr": "10.99.1.300"}
    )


@pytest.mark.parametrize(
    ("fmt", "good", "bad"),
    [
        ("pve-vmid", ["100", "999999999"], ["99", "0100", "1000000000", "abc"]),
        ("pve-node", ["pve", "pve-2"], ["-pve", "pve_2", ""]),
        ("dns-name", ["a", "sbx-1.example.org"], ["a_b", "-a", "a..b"]),
        ("pve-poolid", ["sandbox", "a/b/c"], ["a/b/c/d", "a b"]),
        ("pve-storage-id", ["local", "local-lvm"], ["l", "1local", "local-"]),
        ("pve-configid", ["net0", "tags"], ["0net", "n"]),
        ("pve-configid-list", ["net0,tags;memory", ""], ["net0,0x"]),
        ("pve-tag-list", ["a;b", "x-1.2+3"], ["a b!"]),
        ("mac-addr", ["BC:24:11:00:00:01"], ["01:24:11:00:00:01", "BC:24:11:00:00"]),
        ("pve-ipv4-config", ["dhcp", "manual", "10.99.1.2/16"], ["10.99.1.2", "10.99.1.2/7", "auto"]),
        ("pve-ipv6-config", ["auto", "fd00::2/64"], ["fd00::2/7", "fd00::2"]),
        ("ipv4", ["10.0.0.1"], ["10.0.0.01", "10.0.0.256", "fd00::1"]),
        ("ipv6", ["fd00::1", "::ffff:1.2.3.4"], ["fe80::1%eth0", "10.0.0.1"]),
        ("CIDR", ["10.0.0.0/8", "fd00::/64"], ["10.0.0.0/7", "10.0.0.0"]),
        ("disk-size", ["8G", "1.5T", "4GiB", "100"], ["8X", "G"]),
        ("pve-userid", ["root@pam", "sbx@pve"], ["ab", "no-realm", "a:b@pve"]),
        ("pve-tokenid", ["sbx@pve!t1"], ["sbx@pve", "sbx@pve!1t"]),
        ("pve-startup-order", ["order=1,up=5", "2"], ["later"]),
        ("email-opt", ["", "a@b.c"], ["not an email"]),
        ("IPorCIDRorAlias", ["10.0.0.1", "10.0.0.0/24", "myalias", "dc/myalias"], ["10.0.0.0/33", "1x"]),
        ("pve-fw-dport-spec", ["22", "80:90,443", "ssh"], ["90:80", "nosuchservice", "70000"]),
        ("pve-priv-list", ["VM.Audit,VM.Clone"], ["VM.Fly"]),
    ],
)
def test_named_formats(fmt: str, good: list[str], bad: list[str]) -> None:
    for value in good:
        check_named_format(fmt, value)
    for value in bad:
        with pytest.raises(FormatError) as exc:
            check_named_format(fmt, value)
        assert exc.value.message.endswith("\n")


def test_split_list_like_pve() -> None:
    assert split_list("a, b;c  d") == ["a", "b", "c", "d"]
    assert split_list("a b\0c") == ["a b", "c"]
    assert split_list("") == []


# --- coverage of what the server implements ----------------------------------------------------


def test_implemented_endpoints_exist_in_the_schema_and_use_only_known_formats(schema: Schema) -> None:
    Core.__init__  # noqa: B018  (importing core registers nothing; the api modules do)
    from pve_testserver import api_access, api_cluster, api_firewall, api_lxc, api_tasks  # noqa: F401

    assert len(HANDLERS) >= 60
    for verb, template in HANDLERS:
        assert verb in schema.templates().get(template, {}), (verb, template)
        assert schema.unknown_formats(template, verb) == set(), (verb, template)


def test_privileges_match_the_schema(schema: Schema) -> None:
    role_props = schema.method("/access/roles/{roleid}", "GET").info["returns"]["properties"]
    assert set(role_props) == PRIVILEGES


def test_builtin_roles() -> None:
    assert BUILTIN_ROLES["Administrator"] == PRIVILEGES
    assert BUILTIN_ROLES["NoAccess"] == frozenset()
    assert BUILTIN_ROLES["PVEDatastoreUser"] == {"Datastore.AllocateSpace", "Datastore.Audit"}
    assert BUILTIN_ROLES["PVESDNUser"] == {"SDN.Use", "SDN.Audit"}
    assert BUILTIN_ROLES["PVEPoolAdmin"] == {"Pool.Allocate", "Pool.Audit"}
    assert BUILTIN_ROLES["PVETemplateUser"] == {"VM.Clone", "VM.Audit"}
    assert {"VM.Clone", "VM.Allocate", "VM.PowerMgmt", "VM.Config.Network", "VM.Audit"} <= BUILTIN_ROLES[
        "PVEVMAdmin"
    ]
    assert not any(p.startswith(("Sys.", "Datastore.")) for p in BUILTIN_ROLES["PVEVMAdmin"])
    assert all(p.endswith("Audit") for p in BUILTIN_ROLES["PVEAuditor"])
    assert "Mapping.Modify" not in BUILTIN_ROLES["PVEAdmin"]
    assert (
        not {"Sys.Modify", "Sys.PowerMgmt", "Realm.Allocate", "Permissions.Modify"}
        & BUILTIN_ROLES["PVEAdmin"]
    )
    assert set(BUILTIN_ROLES) == {
        "Administrator",
        "NoAccess",
        "PVEAdmin",
        "PVEAuditor",
        "PVEDatastoreAdmin",
        "PVEDatastoreUser",
        "PVEMappingAdmin",
        "PVEMappingUser",
        "PVEPoolAdmin",
        "PVEPoolUser",
        "PVESDNAdmin",
        "PVESDNUser",
        "PVESysAdmin",
        "PVETemplateUser",
        "PVEUserAdmin",
        "PVEVMAdmin",
        "PVEVMUser",
    }
