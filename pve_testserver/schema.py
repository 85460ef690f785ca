"""The official PVE API schema: route table and parameter validation, answering as PVE answers.

``pve-api-schema.json`` (pve-docs ``apidata.js``) is a tree of ``{path, info: {METHOD: {...}},
children}`` nodes. :class:`Schema` turns it into a component trie like PVE's RESTHandler
(``{name}`` components match any non-empty component; below ``.../storage/{storage}/content`` and
``.../ipset/{name}`` the rest of the URI is one component, because volume IDs and CIDRs contain
``/``), expands indexed parameters (``net[n]`` -> ``net0`` ... ``net31``, with PVE's per-name
maxima), and validates parameters with the rules of ``PVE::JSONSchema::check_prop``: type checks
on the raw strings (booleans only ``0``/``1`` at the top level, like PVE; property strings also
take on/off/yes/no/true/false), ``format`` (named, ``-list``/``-opt``, property-string dicts),
``pattern`` (anchored as PVE anchors it, Perl ``(?^:`` syntax translated), ``maxLength``/
``minLength``, ``minimum``/``maximum``, ``enum``, ``optional``, ``requires``, ``alias`` and
``additionalProperties: 0``. Errors come back as PVE's 400 ``errors`` map.
"""

from __future__ import annotations

import functools
import gzip
import json
import os
import re
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from .errors import param_error
from .formats import FormatError, check_named_format, is_known_format

SCHEMA_ENV = "SANDBOX_RT_PVE_SCHEMA"
# The repo's sibling ``shared/`` directory (see DESIGN.md 4); override with $SANDBOX_RT_PVE_SCHEMA.
DEFAULT_SCHEMA_PATH = Path(__file__).resolve().parents[2] / "shared" / "pve-api-schema.json"


# A gzipped copy of the same file (pve-docs commit e5010dc) ships with the tests, so a clone without
# the sibling shared/ directory runs them too.
BUNDLED_SCHEMA_PATH = Path(__file__).resolve().parent / "data" / "pve-api-schema.json.gz"


def schema_path() -> Path:
    env = os.environ.get(SCHEMA_ENV)
    if env:
        return Path(env)
    return DEFAULT_SCHEMA_PATH if DEFAULT_SCHEMA_PATH.exists() else BUNDLED_SCHEMA_PATH


# How many instances PVE defines of each indexed option (net[n] -> net0..net31 for LXC, ...).
INDEX_MAX: dict[str, int] = {
    "net": 32,
    "mp": 256,
    "unused": 256,
    "dev": 256,
    "ide": 4,
    "sata": 6,
    "scsi": 31,
    "virtio": 16,
    "usb": 14,
    "hostpci": 16,
    "serial": 4,
    "parallel": 3,
    "numa": 8,
    "ipconfig": 32,
    "virtiofs": 10,
    "link": 8,
    "acmedomain": 5,
}
DEFAULT_INDEX_MAX = 32

# Mount points whose sub-handler joins the rest of the URI into one component (PVE's
# fragmentDelimiter => ''): volume IDs and CIDRs contain slashes.
REST_JOIN_AFTER: frozenset[str] = frozenset(
    {
        "/nodes/{node}/storage/{storage}/content",
        "/cluster/firewall/ipset/{name}",
        "/nodes/{node}/qemu/{vmid}/firewall/ipset/{name}",
        "/nodes/{node}/lxc/{vmid}/firewall/ipset/{name}",
    }
)

_MISSING = "property is missing and it is not optional"
_NOT_IN_SCHEMA = "property is not defined in schema and the schema does not allow additional properties"
_NUMBER_RE = re.compile(r"^[+-]?(\d+\.\d+|\d+\.|\.\d+|\d+)([eE][+-]?\d+)?$")
_INTEGER_RE = re.compile(r"^[+-]?\d+$")


class PropertyStringError(FormatError):
    """A property string failed to parse; carries the nested errors like PVE's exception."""

    def __init__(self, message: str, errors: dict[str, str] | None = None) -> None:
        text = message if message.endswith("\n") else message + "\n"
        for key in sorted(errors or {}):
            text += f"{key}: {(errors or {})[key]}\n"
        super().__init__(text)
        self.errors = errors or {}


@functools.lru_cache(maxsize=1024)
def perl_regex(pattern: str) -> re.Pattern[str]:
    """Translate a schema pattern (Perl syntax) and anchor it like ``m/^$pattern$/``."""
    py = pattern.replace("(?^i:", "(?i:").replace("(?^:", "(?:")
    return re.compile("^" + py + "$")


def parse_boolean(value: str) -> str | None:
    """PVE::JSONSchema::parse_boolean (property strings): -> '1' / '0' / None."""
    if re.match(r"^(1|on|yes|true)$", value, re.IGNORECASE):
        return "1"
    if re.match(r"^(0|off|no|false)$", value, re.IGNORECASE):
        return "0"
    return None


def _add_error(errors: dict[str, str], path: str, msg: str) -> None:
    path = path or "_root"
    errors[path] = f"{errors[path]}\\n{msg}" if path in errors else msg


def _perl_ref(value: Any) -> str | None:
    """The name Perl's ``ref()`` gives a decoded JSON value, None for plain scalars."""
    if isinstance(value, bool):
        return "JSON::PP::Boolean"
    if isinstance(value, list):
        return "ARRAY"
    if isinstance(value, dict):
        return "HASH"
    return None


def _scalar_text(value: Any) -> str:
    if isinstance(value, float) and value.is_integer():
        return str(int(value))
    return str(value)


def _check_type(path: str, typ: Any, value: Any, errors: dict[str, str]) -> bool:
    if not typ or typ == "any":
        return True
    if isinstance(typ, list):
        for t in typ:
            if _check_type(path, t, value, {}):
                return True
        _add_error(errors, path, f"type check ('{'|'.join(typ)}') failed")
        return False
    ref = _perl_ref(value)
    if typ == "null":
        _add_error(errors, path, f"type check ('{typ}') failed - value is not null")
        return False
    if typ == "array":
        if ref != "ARRAY":
            _add_error(errors, path, f"type check ('{typ}') failed")
            return False
        return True
    if typ == "object":
        if ref != "HASH":
            _add_error(errors, path, f"type check ('{typ}') failed")
            return False
        return True
    if ref is not None:
        if typ == "boolean" and ref == "JSON::PP::Boolean":
            return True
        _add_error(errors, path, f"type check ('{typ}') failed - got {ref}")
        return False
    text = _scalar_text(value)
    ok = True
    if typ == "boolean":
        ok = text in ("0", "1")
    elif typ == "integer":
        ok = bool(_INTEGER_RE.match(text))
    elif typ == "number":
        ok = bool(_NUMBER_RE.match(text))
    if not ok:
        _add_error(errors, path, f"type check ('{typ}') failed - got '{text}'")
    return ok


def parse_property_string(fmt: Mapping[str, Any], data: str, path: str = "") -> dict[str, str]:
    """PVE::JSONSchema::parse_property_string for a dict format; raises PropertyStringError."""
    res: dict[str, str] = {}
    default_key: str | None = None
    for part in data.split(","):
        if not part.strip():
            continue
        m = re.match(r"^([^=]+)=(.+)$", part)
        if m:
            key, val = m.group(1), m.group(2)
            if key in res:
                raise PropertyStringError(f"duplicate key in comma-separated list property: {key}")
            sub = fmt.get(key)
            if sub is not None and sub.get("alias"):
                if sub.get("keyAlias"):
                    key_alias = sub["keyAlias"]
                    if key_alias in res:
                        raise PropertyStringError(f"key alias '{key_alias}' is already defined")
                    res[key_alias] = key
                key = sub["alias"]
                sub = fmt.get(key)
                if key in res:
                    raise PropertyStringError(f"key '{key}' is already defined (via alias)")
            if sub is None:
                raise PropertyStringError(f"invalid key in comma-separated list property: {key}")
            if sub.get("type") == "boolean":
                val = parse_boolean(val) or val
            res[key] = val
        elif "=" not in part:
            if default_key:
                raise PropertyStringError(f"duplicate key in comma-separated list property: {default_key}")
            for key, sub in fmt.items():
                if sub.get("default_key"):
                    default_key = key
                    if res.get(key) in (None, "", "0"):
                        res[key] = (parse_boolean(part) or part) if sub.get("type") == "boolean" else part
                        break
                    raise PropertyStringError(f"duplicate key in comma-separated list property: {key}")
            if not default_key:
                raise PropertyStringError("value without key, but schema does not define a default key")
        else:
            raise PropertyStringError("missing key in comma-separated list property")
    errors: dict[str, str] = {}
    check_object(path, fmt, res, 0, errors)
    if errors:
        raise PropertyStringError("format error", errors)
    return res


def print_property_string(values: Mapping[str, Any], first: tuple[str, ...] = ()) -> str:
    """Render a parsed property string back, ``first`` keys leading, the rest sorted."""
    keys = [k for k in first if k in values] + sorted(k for k in values if k not in first)
    return ",".join(f"{k}={values[k]}" for k in keys if values[k] is not None)


def _check_format(fmt: Any, value: str, path: str) -> None:
    if isinstance(fmt, dict):
        parse_property_string(fmt, value, path)
    elif isinstance(fmt, str) and fmt != "regex":
        check_named_format(fmt, value)


def check_prop(value: Any, schema: Mapping[str, Any], path: str, errors: dict[str, str]) -> None:
    """PVE::JSONSchema::check_prop (without the oneOf/instance-type machinery)."""
    if schema.get("alias"):
        return
    if value is None:
        if schema.get("type") == "null":
            return
        if not schema.get("optional") and not schema.get("group"):
            _add_error(errors, path, _MISSING)
        return
    if not _check_type(path, schema.get("type"), value, errors):
        return
    if isinstance(value, list):
        items = schema.get("items")
        if isinstance(items, dict):
            for i, item in enumerate(value):
                check_prop(item, items, f"{path}[{i}]", errors)
        return
    if isinstance(value, dict):
        if "properties" in schema or schema.get("additionalProperties"):
            check_object(
                path, schema.get("properties") or {}, value, schema.get("additionalProperties"), errors
            )
        return
    if isinstance(value, bool):
        return
    text = _scalar_text(value)
    fmt = schema.get("format")
    if fmt:
        try:
            _check_format(fmt, text, path)
        except FormatError as exc:
            _add_error(errors, path, f"invalid format - {exc.message}")
            return
    pattern = schema.get("pattern")
    if pattern and not perl_regex(pattern).search(text):
        _add_error(errors, path, "value does not match the regex pattern")
        return
    if schema.get("maxLength") is not None and len(text) > int(schema["maxLength"]):
        _add_error(errors, path, f"value may only be {schema['maxLength']} characters long")
        return
    if schema.get("minLength") is not None and len(text) < int(schema["minLength"]):
        _add_error(errors, path, f"value must be at least {schema['minLength']} characters long")
        return
    if _NUMBER_RE.match(text):
        num = float(text)
        if schema.get("maximum") is not None and num > float(schema["maximum"]):
            _add_error(errors, path, f"value must have a maximum value of {schema['maximum']}")
            return
        if schema.get("minimum") is not None and num < float(schema["minimum"]):
            _add_error(errors, path, f"value must have a minimum value of {schema['minimum']}")
            return
    enum = schema.get("enum")
    if enum and text not in [str(e) for e in enum]:
        _add_error(
            errors,
            path,
            f"value '{text}' does not have a value in the enumeration '{', '.join(map(str, enum))}'",
        )


def check_object(
    path: str, props: Mapping[str, Any], value: dict[str, Any], additional: Any, errors: dict[str, str]
) -> None:
    """PVE::JSONSchema::check_object."""
    for key in list(value):
        sub = props.get(key)
        alias = sub.get("alias") if sub else None
        if alias:
            if value.get(alias) is not None:
                _add_error(
                    errors,
                    f"{path}.{key}" if path else key,
                    f"cannot set both '{key}' and its alias target '{alias}'",
                )
            else:
                value[alias] = value.pop(key)
    for key, sub in props.items():
        check_prop(value.get(key), sub, f"{path}.{key}" if path else key, errors)
    for key in value:
        newpath = f"{path}.{key}" if path else key
        sub = props.get(key)
        if sub is not None:
            requires = sub.get("requires")
            if isinstance(requires, str) and value.get(requires) is None:
                _add_error(
                    errors,
                    f"{path}.{requires}" if path else requires,
                    f"missing property required by '{newpath}'",
                )
            continue
        if additional is not None and not additional:
            _add_error(errors, newpath, _NOT_IN_SCHEMA)
            continue
        if isinstance(additional, dict):
            check_prop(value[key], additional, newpath, errors)


def _convert(value: Any, typ: Any) -> Any:
    if isinstance(value, (list, dict)) or typ not in ("boolean", "integer", "number", "string"):
        return value
    if typ == "boolean":
        return value if isinstance(value, bool) else _scalar_text(value) == "1"
    text = _scalar_text(value)
    if typ == "integer":
        return int(text)
    if typ == "number":
        return float(text)
    return text


def expand_indexed(props: Mapping[str, Any]) -> dict[str, Any]:
    """``net[n]`` -> ``net0`` .. ``net{max-1}`` (PVE's schema lists them one by one)."""
    out: dict[str, Any] = {}
    for name, sub in props.items():
        m = re.match(r"^([a-z]+)\[n\]$", name)
        if not m:
            out[name] = sub
            continue
        for i in range(INDEX_MAX.get(m.group(1), DEFAULT_INDEX_MAX)):
            out[f"{m.group(1)}{i}"] = sub
    return out


@dataclass(frozen=True)
class Method:
    """One HTTP method of one path template."""

    path: str
    method: str
    info: Mapping[str, Any]
    properties: Mapping[str, Any]

    @property
    def name(self) -> str:
        return str(self.info.get("name", ""))

    @property
    def permissions(self) -> Mapping[str, Any] | None:
        perms = self.info.get("permissions")
        return perms if isinstance(perms, dict) else None

    @property
    def allowtoken(self) -> bool:
        return bool(self.info.get("allowtoken", 1))

    @property
    def proxyto(self) -> str | None:
        proxy = self.info.get("proxyto")
        return str(proxy) if proxy else None

    @property
    def additional(self) -> Any:
        return (self.info.get("parameters") or {}).get("additionalProperties")

    def formats(self) -> Iterator[str]:
        """Every named format this method's parameters use (recursing into property strings)."""
        stack: list[Mapping[str, Any]] = list(self.properties.values())
        while stack:
            sub = stack.pop()
            fmt = sub.get("format")
            if isinstance(fmt, str):
                yield fmt
            elif isinstance(fmt, dict):
                stack.extend(fmt.values())
            if isinstance(sub.get("items"), dict):
                stack.append(sub["items"])

    def validate(self, params: Mapping[str, Any]) -> dict[str, Any]:
        """Validate like RESTHandler::handle; returns typed values or raises the 400 PVEError."""
        work = dict(params)
        for key, val in list(work.items()):
            sub = self.properties.get(key)
            if not sub or not val:
                continue
            if (
                isinstance(val, list)
                and sub.get("type") == "string"
                and str(sub.get("format", "")).endswith("-list")
            ):
                work[key] = ",".join(map(str, val))
            elif not isinstance(val, list) and sub.get("type") == "array":
                work[key] = [val]
        errors: dict[str, str] = {}
        check_object("", self.properties, work, self.additional, errors)
        if errors:
            raise param_error(errors)
        out: dict[str, Any] = {}
        for key, val in work.items():
            if val is None:
                continue
            sub = self.properties.get(key) or {}
            out[key] = _convert(val, sub.get("type"))
        return out


@dataclass
class _Trie:
    folders: dict[str, _Trie] = field(default_factory=dict)
    param: tuple[str, _Trie] | None = None
    template: str | None = None
    methods: dict[str, Method] = field(default_factory=dict)
    rest_join: bool = False


class Schema:
    """Route table + validator built from the API schema."""

    def __init__(self, tree: list[Mapping[str, Any]]) -> None:
        self._root = _Trie()
        self._templates: dict[str, dict[str, Method]] = {}
        stack = list(tree)
        while stack:
            node = stack.pop()
            self._add(node)
            stack.extend(node.get("children") or [])

    @staticmethod
    def load(path: Path | None = None) -> Schema:
        """Load (and cache) the schema from ``path`` or :func:`schema_path`."""
        return _load_cached(path or schema_path())

    def _add(self, node: Mapping[str, Any]) -> None:
        template = str(node["path"])
        trie = self._root
        walked = ""
        for comp in [c for c in template.split("/") if c]:
            walked += "/" + comp
            m = re.match(r"^\{([\w-]+)\}$", comp)
            if m:
                if trie.param is None:
                    trie.param = (m.group(1), _Trie())
                trie = trie.param[1]
            else:
                trie = trie.folders.setdefault(comp, _Trie())
            if walked in REST_JOIN_AFTER:
                trie.rest_join = True
        trie.template = template
        methods: dict[str, Method] = {}
        for verb, info in (node.get("info") or {}).items():
            props = expand_indexed((info.get("parameters") or {}).get("properties") or {})
            methods[verb] = Method(template, verb, info, props)
        trie.methods = methods
        self._templates[template] = methods

    def match(self, path: str) -> tuple[str, dict[str, Method], dict[str, str]] | None:
        """Map a URI path (after /api2/json) to (template, methods, uri params); None if unknown."""
        comps = [c for c in path.split("/") if c]
        trie = self._root
        uri: dict[str, str] = {}
        i = 0
        while i < len(comps):
            comp = comps[i]
            if trie.param is not None:
                name, trie = trie.param
                uri[name] = comp
            elif comp in trie.folders:
                trie = trie.folders[comp]
            else:
                return None
            i += 1
            if trie.rest_join and i < len(comps) - 1:
                comps = [*comps[:i], "/".join(comps[i:])]
        if trie.template is None:
            return None
        return trie.template, trie.methods, uri

    def method(self, template: str, verb: str) -> Method:
        return self._templates[template][verb]

    def templates(self) -> dict[str, dict[str, Method]]:
        return self._templates

    def unknown_formats(self, template: str, verb: str) -> set[str]:
        return {f for f in self.method(template, verb).formats() if not is_known_format(f)}


@functools.cache
def _load_cached(path: Path) -> Schema:
    if path.suffix == ".gz":
        with gzip.open(path, "rt", encoding="utf-8") as gz:
            return Schema(json.load(gz))
    with path.open(encoding="utf-8") as fh:
        return Schema(json.load(fh))
