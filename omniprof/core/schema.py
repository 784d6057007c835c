"""JSON Schema of ``ProfileResult.to_dict()``, derived from the attrs classes.

``python -m omniprof.core.schema > docs/schema/profile-result.schema.json`` regenerates the
committed file; a test checks the two agree and validates real results against it.
"""

from __future__ import annotations

import json
import re
import sys
from typing import Any

import attrs

from omniprof.core import results as r

__all__ = ["result_schema"]

_CLASSES = [r.Frame, r.ThreadInfo, r.TaskInfo, r.Track, r.Span, r.Instant, r.Flow, r.StackSample, r.CounterSeries,
            r.Allocation, r.Table, r.Loss, r.ErrorRecord, r.Artifact, r.ClockInfo, r.BackendResult, r.RunMetadata,
            r.ProfileResult]
_NAMES = {c.__name__ for c in _CLASSES}
_SCALAR = {"int": {"type": "integer"}, "str": {"type": "string"}, "bool": {"type": "boolean"},
           "float": {"type": "number"}, "Any": {}}


def _type(t: str) -> dict[str, Any]:
    t = t.strip()
    if " | None" in t:
        return {"anyOf": [_type(t.replace(" | None", "")), {"type": "null"}]}
    if t in _SCALAR:
        return dict(_SCALAR[t])
    if t in _NAMES:
        return {"$ref": f"#/$defs/{t}"}
    m = re.fullmatch(r"tuple\[(.*), \.\.\.\]", t)
    if m:
        return {"type": "array", "items": _type(m.group(1))}
    if t.startswith("Mapping["):
        inner = t[len("Mapping["):-1].split(",", 1)[1]
        return {"type": "object", "additionalProperties": _type(inner)}
    raise ValueError(f"no JSON Schema mapping for type {t!r}")


def _class_schema(cls: type) -> dict[str, Any]:
    props = {}
    required = []
    for a in attrs.fields(cls):
        t = cls.__annotations__.get(a.name, a.type)  # the source text (attrs.resolve_types replaces a.type)
        props[a.name] = _type(t if isinstance(t, str) else t.__name__)
        if a.default is attrs.NOTHING:
            required.append(a.name)
    doc = (cls.__doc__ or "").strip().splitlines()[0] if cls.__doc__ else cls.__name__
    out: dict[str, Any] = {"type": "object", "description": doc, "properties": props, "additionalProperties": False}
    if required:
        out["required"] = required
    return out


def result_schema() -> dict[str, Any]:
    """The JSON Schema (draft 2020-12) of a saved ProfileResult."""
    schema = {
        "$schema": "https://json-schema.org/draft/2020-12/schema",
        "$id": "https://omniprof.invalid/schema/profile-result.schema.json",
        "title": "omniprof ProfileResult",
        "$ref": "#/$defs/ProfileResult",
        "$defs": {c.__name__: _class_schema(c) for c in _CLASSES},
    }
    schema["$defs"]["ProfileResult"]["properties"]["schema_version"] = {"const": r.SCHEMA_VERSION}
    schema["$defs"]["ProfileResult"]["required"] = ["schema_version", "metadata", "parts"]
    return schema


if __name__ == "__main__":  # pragma: no cover - regeneration entry point
    sys.stdout.write(json.dumps(result_schema(), indent=2) + "\n")
