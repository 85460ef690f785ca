"""The JSON kinds a request field may have, as pydantic types: each checks the decoded JSON value
(a number is not a string that looks like one, a boolean is not a number) and documents itself in
the OpenAPI schema. Ranges are the runtime's to check (:mod:`sandbox_rt.validation`, one place):
the schema quotes its limits, the runtime enforces them with the same numbers.

A wrong kind raises :class:`KindError`, whose message lacks the field's name: the request layer
puts the name in front ("field 'cpus' must be a number, not string 'two'").
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from pydantic import GetCoreSchemaHandler, GetJsonSchemaHandler
from pydantic.json_schema import JsonSchemaValue
from pydantic_core import CoreSchema, core_schema

from ..execution import COMMAND_BLANKS
from .errors import json_type

__all__ = ["Kind", "KindError", "exact"]


class KindError(ValueError):
    """A value of the wrong JSON kind; the message reads after the field's name."""


def exact(regex: str) -> str:
    """A pattern the whole string must match, in ECMA-262 and in Python's ``re.search`` alike.

    JSON Schema means ECMA-262 regexes, whose ``$`` is the end of the text, but Python's validators
    (jsonschema, hypothesis) use ``re.search``, whose ``$`` also matches before a final newline:
    the lookahead refuses ``"sbx-0123456789\\n"`` in both."""
    return f"^{regex}$(?!\\n)"


def _number(value: Any) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool)


def _string_map(value: Any) -> bool:
    return isinstance(value, dict) and all(isinstance(v, str) for v in value.values())


def _string_list(value: Any) -> bool:
    return isinstance(value, list) and all(isinstance(w, str) for w in value)


def _command(value: Any) -> bool:
    if isinstance(value, str):
        return bool(value.strip(COMMAND_BLANKS))
    return isinstance(value, list) and bool(value) and all(isinstance(w, str) for w in value)


# kind -> (test, how a message names it, its JSON Schema)
_KINDS: dict[str, tuple[Callable[[Any], bool], str, dict[str, Any]]] = {
    "string": (lambda v: isinstance(v, str), "a string", {"type": "string"}),
    "number": (_number, "a number", {"type": "number"}),
    "integer": (lambda v: _number(v) and float(v).is_integer(), "a whole number", {"type": "integer"}),
    "boolean": (lambda v: isinstance(v, bool), "true or false", {"type": "boolean"}),
    "string_map": (
        _string_map,
        "an object whose values are strings",
        {"type": "object", "additionalProperties": {"type": "string"}},
    ),
    "string_list": (_string_list, "an array of strings", {"type": "array", "items": {"type": "string"}}),
    "command": (
        _command,
        "a non-empty string or a non-empty array of strings",
        {
            "oneOf": [
                {"type": "string", "minLength": 1, "description": "Run by bash as written."},
                {
                    "type": "array",
                    "minItems": 1,
                    "items": {"type": "string"},
                    "description": "An exact argv, quoted word by word.",
                },
            ]
        },
    ),
}


def _integral(value: Any) -> Any:
    """1.0 -> 1: JSON does not tell 1 from 1.0, the runtime's integer arguments do."""
    return int(value) if isinstance(value, float) and value.is_integer() else value


class Kind:
    """Annotation of a request field: JSON kind ``name`` (``nullable``: null is accepted and
    documented); ``schema`` adds keywords to its JSON Schema (pattern, minimum, maximum, ...).

    ``Annotated[float, Kind("number", exclusiveMinimum=0)]``: the checks are this class's, not
    pydantic's coercions (which would take "2" for 2 and true for 1)."""

    def __init__(self, name: str, *, nullable: bool = False, **schema: Any) -> None:
        self.test, self.what, base = _KINDS[name]
        self.nullable = nullable
        doc = {**base, **schema}
        if nullable:
            if "type" in doc:
                doc["type"] = [doc["type"], "null"]
            else:
                doc = {"anyOf": [doc, {"type": "null"}]}
        self.doc = doc

    def validate(self, value: Any) -> Any:
        if value is None and self.nullable:
            return None
        if not self.test(value):
            raise KindError(f"must be {self.what}, not {json_type(value)} {value!r:.60}")
        return _integral(value)

    def __get_pydantic_core_schema__(self, source: Any, handler: GetCoreSchemaHandler) -> CoreSchema:
        return core_schema.no_info_plain_validator_function(self.validate)

    def __get_pydantic_json_schema__(
        self, schema: CoreSchema, handler: GetJsonSchemaHandler
    ) -> JsonSchemaValue:
        return dict(self.doc)
