"""The schema copy shipped with the tests is the official one in ../shared (where that exists)."""

import gzip
import json

from pve_testserver.schema import BUNDLED_SCHEMA_PATH, DEFAULT_SCHEMA_PATH


def test_bundled_schema_is_the_official_one() -> None:
    bundled = gzip.decompress(BUNDLED_SCHEMA_PATH.read_bytes())
    roots = json.loads(bundled)
    assert {r["path"] for r in roots} >= {"/nodes", "/cluster", "/access", "/pools"}
    if DEFAULT_SCHEMA_PATH.exists():  # a clone with shared/ beside it: byte for byte the same
        assert bundled == DEFAULT_SCHEMA_PATH.read_bytes()
