import json
from pathlib import Path

import pytest

from sandbox_rt.config import Settings
from sandbox_rt.errors import ConfigError


def test_load_reads_host_json_and_env_overrides(tmp_path: Path) -> None:
    f = tmp_path / "host.json"
    f.write_text(json.dumps({"bridge": "vmbr9", "lxc_path": "/srv/lxc", "idmap_base": 200000}))
    s = Settings.load(f, env={"SANDBOX_RT_TEMPLATE": "tpl2", "SANDBOX_RT_SSH_READY_TIMEOUT_S": "5"})
    assert s.bridge == "vmbr9" and s.lxc_path == Path("/srv/lxc") and s.idmap_base == 200000
    assert s.template == "tpl2" and s.ssh_ready_timeout_s == 5.0


def test_missing_file_means_defaults(tmp_path: Path) -> None:
    s = Settings.load(tmp_path / "absent.json", env={})
    assert s.gateway == "10.99.0.1" and s.network_cidr == "10.99.0.0/16"


@pytest.mark.parametrize(
    ("values", "needle"),
    [
        ({"network_cidr": "10.99.0.1/33"}, "network_cidr"),
        ({"gateway": "192.168.1.1"}, "gateway=192.168.1.1 is not inside"),
        ({"ip_pool_start": "10.99.9.9", "ip_pool_end": "10.99.1.1"}, "ip_pool_start"),
        ({"backend": "docker"}, "backend='docker'"),
        ({"bogus_key": 1}, "unknown key(s)"),
        ({"idmap_base": "many"}, "idmap_base='many'"),
        ({"disk_limits": "maybe"}, "disk_limits='maybe' is not a valid bool"),
        ({"volume_host_dirs": ["/srv/shared/../.."]}, "'..' component"),
        ({"volume_host_dirs": ["/srv/./shared"]}, "'..' component"),
    ],
)
def test_bad_settings_are_named(tmp_path: Path, values: dict[str, object], needle: str) -> None:
    f = tmp_path / "host.json"
    f.write_text(json.dumps(values))
    with pytest.raises(ConfigError) as err:
        Settings.load(f, env={})
    assert needle in str(err.value)


def test_malformed_file_is_a_config_error(tmp_path: Path) -> None:
    f = tmp_path / "host.json"
    f.write_text("{not json")
    with pytest.raises(ConfigError, match="cannot read"):
        Settings.load(f, env={})


@pytest.mark.parametrize(
    ("file_value", "env_value", "expected"),
    [
        (True, None, True),
        (False, None, False),
        (True, "false", False),
        (False, "yes", True),
        (None, "0", False),
    ],
)
def test_disk_limits_is_a_boolean_from_file_or_env(
    tmp_path: Path, file_value: bool | None, env_value: str | None, expected: bool
) -> None:
    f = tmp_path / "host.json"
    f.write_text(json.dumps({} if file_value is None else {"disk_limits": file_value}))
    env = {} if env_value is None else {"SANDBOX_RT_DISK_LIMITS": env_value}
    assert Settings.load(f, env=env).disk_limits is expected
