"""``ProfileOptions``: the options every backend understands, with JAX's documented meaning.

Unlike ``jax.profiler.ProfileOptions``, every value is validated, on construction and on
assignment, and unknown ``advanced_configuration`` keys are rejected with the nearest valid key.
Backend-specific settings live in each backend's own ``Options`` class; :func:`build_options`
turns a plain mapping (from a config file or ``-O key=value``) into one of those classes.
"""

from __future__ import annotations

import json
import re
import types
from collections.abc import Mapping
from typing import Any

import attrs

from omniprof.core import validators as v
from omniprof.errors import InvalidArgumentError

__all__ = ["ProfileOptions", "AdvancedKey", "ADVANCED_KEYS", "build_options", "parse_cli_value"]

INT32_MAX = 2**31 - 1

_PM_METRIC = re.compile(r"^[A-Za-z0-9_]+(?:__[A-Za-z0-9_]+)?(?:\.[A-Za-z0-9_]+)*$")


@attrs.frozen
class AdvancedKey:
    """One key of ``advanced_configuration``.

    Attributes:
        name: the key.
        platform: ``"tpu"`` or ``"gpu"``.
        kind: ``"enum"``, ``"int"``, ``"bool"`` or ``"metrics"`` (comma-separated metric names).
        default: the value used when the key is not given (None: the runtime decides).
        allowed: for ``enum``, the allowed strings.
        lo, hi: for ``int``, the inclusive range.
        doc: one line on what it does.
    """

    name: str
    platform: str
    kind: str
    default: Any
    doc: str
    allowed: tuple[str, ...] = ()
    lo: int | None = None
    hi: int | None = None

    def validate(self, value: Any) -> None:
        label = f"advanced_configuration[{self.name!r}]"
        if self.kind == "enum":
            if not isinstance(value, str) or value not in self.allowed:
                raise InvalidArgumentError(
                    f"{label} must be one of {', '.join(self.allowed)} (got {value!r})"
                    + _nearest_suffix(value, self.allowed)
                )
        elif self.kind == "int":
            v.int_in_range(self.lo, self.hi)(None, label, value)
        elif self.kind == "bool":
            v.is_bool(None, label, value)
        elif self.kind == "metrics":
            if not isinstance(value, str):
                raise InvalidArgumentError(
                    f"{label} must be a comma-separated string of metric names (got {value!r} of type {v.type_name(value)})"
                )
            names = [n.strip() for n in value.split(",")] if value.strip() else []
            for n in names:
                if not n or not _PM_METRIC.match(n):
                    raise InvalidArgumentError(
                        f"{label} must be a comma-separated string of metric names such as "
                        f"'sm__cycles_active.avg.pct_of_peak_sustained_elapsed' (got bad name {n!r} in {value!r})"
                    )
        else:  # pragma: no cover - table below is fixed
            raise AssertionError(self.kind)


def _nearest_suffix(value: Any, allowed: tuple[str, ...]) -> str:
    if isinstance(value, str):
        near = v.nearest(value, allowed)
        if near:
            return f"; did you mean {near!r}?"
    return ""


TPU_TRACE_MODES = ("TRACE_ONLY_HOST", "TRACE_ONLY_XLA", "TRACE_COMPUTE", "TRACE_COMPUTE_AND_SYNC")

ADVANCED_KEYS: Mapping[str, AdvancedKey] = types.MappingProxyType({k.name: k for k in [
    AdvancedKey("tpu_trace_mode", "tpu", "enum", "TRACE_ONLY_XLA",
                "what TPU tracing records: host only, XLA ops, compute, or compute and sync",
                allowed=TPU_TRACE_MODES),
    AdvancedKey("tpu_num_sparse_cores_to_trace", "tpu", "int", None,
                "number of sparse cores to trace on the TPU", lo=0, hi=INT32_MAX),
    AdvancedKey("tpu_num_sparse_core_tiles_to_trace", "tpu", "int", None,
                "number of tiles within each sparse core to trace", lo=0, hi=INT32_MAX),
    AdvancedKey("tpu_num_chips_to_profile_per_task", "tpu", "int", None,
                "number of TPU chips to profile per task", lo=0, hi=INT32_MAX),
    AdvancedKey("gpu_max_callback_api_events", "gpu", "int", 2 * 1024 * 1024,
                "maximum events collected by the CUPTI callback API (drops are counted)", lo=1, hi=INT32_MAX),
    AdvancedKey("gpu_max_activity_api_events", "gpu", "int", 2 * 1024 * 1024,
                "maximum events collected by the CUPTI activity API (drops are counted)", lo=1, hi=INT32_MAX),
    AdvancedKey("gpu_max_annotation_strings", "gpu", "int", 1024 * 1024,
                "maximum number of annotation strings collected", lo=1, hi=INT32_MAX),
    AdvancedKey("gpu_enable_nvtx_tracking", "gpu", "bool", False, "record NVTX ranges through CUPTI"),
    AdvancedKey("gpu_enable_cupti_activity_graph_trace", "gpu", "bool", False,
                "trace CUDA graphs as graph-level activity"),
    AdvancedKey("gpu_pm_sample_counters", "gpu", "metrics", "",
                "comma-separated CUPTI PM sampling metrics (empty: PM sampling off)"),
    AdvancedKey("gpu_pm_sample_interval_us", "gpu", "int", 500,
                "PM sampling interval in microseconds", lo=1, hi=INT32_MAX),
    AdvancedKey("gpu_pm_sample_buffer_size_per_gpu_mb", "gpu", "int", 64,
                "system memory buffer per GPU for PM sampling, in MB (at most 4096, i.e. 4 GB)", lo=1, hi=4096),
    AdvancedKey("gpu_num_chips_to_profile_per_task", "gpu", "int", 0,
                "number of GPUs to profile per task (0: all)", lo=0, hi=INT32_MAX),
    AdvancedKey("gpu_dump_graph_node_mapping", "gpu", "bool", False,
                "dump CUDA graph node mapping into the trace"),
]})


def _validate_advanced(inst: Any, attribute: Any, value: Any) -> None:
    if not isinstance(value, Mapping):
        raise InvalidArgumentError(
            f"'advanced_configuration' must be a mapping of key to value (got {value!r} of type {v.type_name(value)})"
        )
    for key, val in value.items():
        if not isinstance(key, str) or key not in ADVANCED_KEYS:
            raise InvalidArgumentError(
                v.unknown_key_message(str(key), ADVANCED_KEYS, what="advanced_configuration key", got=val)
            )
        ADVANCED_KEYS[key].validate(val)


def _freeze_mapping(value: Any) -> Any:
    # A read-only copy: item assignment cannot bypass validation. Metric lists are normalised
    # (' a , b ' -> 'a,b'): the runtime splits on commas and would look for ' b'.
    if isinstance(value, Mapping):
        out = dict(value)
        for key, val in out.items():
            spec = ADVANCED_KEYS.get(key) if isinstance(key, str) else None
            if spec is not None and spec.kind == "metrics" and isinstance(val, str):
                names = [n.strip() for n in val.split(",")]
                out[key] = ",".join(names) if any(names) else ""
        return types.MappingProxyType(out)
    return value


def _mark_explicit(inst: Any, attribute: Any, value: Any) -> Any:
    object.__setattr__(inst, "_explicit", inst._explicit | {attribute.name})
    return value


@attrs.define(kw_only=True, init=False,
              on_setattr=attrs.setters.pipe(attrs.setters.convert, attrs.setters.validate, _mark_explicit))
class ProfileOptions:
    """Options every backend understands, with the meaning JAX documents.

    Attributes:
        host_tracer_level: 0 off, 1 user annotations only, 2 plus high-level execution (default),
            3 plus verbose low-level detail.
        device_tracer_level: 0 no device activity, 1 device activity (default).
        python_tracer_level: 0 no Python call tracing (default), 1 exact Python call/return tracing.
        advanced_configuration: TPU and GPU keys of :data:`ADVANCED_KEYS`; read-only once set
            (assign a new mapping to change it).

    Every value is validated on construction and on assignment. :meth:`is_explicit` tells a value
    given (to the constructor, a config file, ``-O``, or by assignment) from a default, so a backend
    can warn only about what the user asked for:

    >>> ProfileOptions().is_explicit("device_tracer_level")
    False
    >>> ProfileOptions(device_tracer_level=1).is_explicit("device_tracer_level")
    True

    >>> opts = ProfileOptions(host_tracer_level=3)
    >>> opts.host_tracer_level = 7
    Traceback (most recent call last):
    ...
    omniprof.errors.InvalidArgumentError: 'host_tracer_level' must be one of 0, 1, 2, 3 (got 7)

    .. versionadded:: 0.1
    """

    host_tracer_level: int = attrs.field(default=2, validator=v.one_of(0, 1, 2, 3))
    device_tracer_level: int = attrs.field(default=1, validator=v.one_of(0, 1))
    python_tracer_level: int = attrs.field(default=0, validator=v.one_of(0, 1))
    advanced_configuration: Mapping[str, Any] = attrs.field(
        factory=dict, converter=_freeze_mapping, validator=_validate_advanced,
        eq=attrs.cmp_using(eq=lambda a, b: dict(a) == dict(b)),
    )
    _explicit: frozenset[str] = attrs.field(factory=frozenset, init=False, eq=False, repr=False, on_setattr=None)

    def __init__(self, **options: Any) -> None:
        # A misspelt field is an InvalidArgumentError naming the nearest one (attrs' own __init__
        # would raise a bare TypeError). The names given are remembered (is_explicit).
        v.check_keys(options, [a.name for a in attrs.fields(type(self)) if a.init], what="profile option")
        self.__attrs_init__(**options)
        object.__setattr__(self, "_explicit", frozenset(options))

    def is_explicit(self, name: str) -> bool:
        """Whether ``name`` was given rather than left at its default."""
        return name in self._explicit

    def advanced(self, key: str) -> Any:
        """The effective value of an advanced key: the one given, else its documented default."""
        if key not in ADVANCED_KEYS:
            raise InvalidArgumentError(v.unknown_key_message(key, ADVANCED_KEYS, what="advanced_configuration key"))
        return self.advanced_configuration.get(key, ADVANCED_KEYS[key].default)

    def to_dict(self) -> dict[str, Any]:
        return {
            "host_tracer_level": self.host_tracer_level,
            "device_tracer_level": self.device_tracer_level,
            "python_tracer_level": self.python_tracer_level,
            "advanced_configuration": dict(self.advanced_configuration),
        }

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> ProfileOptions:
        """Build from a plain mapping; unknown keys raise with the nearest valid key."""
        if not isinstance(data, Mapping):
            raise InvalidArgumentError(f"profile options must be a mapping (got {data!r})")
        v.check_keys(data, [a.name for a in attrs.fields(cls) if a.init], what="profile option")
        return cls(**data)


def parse_cli_value(text: str) -> Any:
    """Parse ``-O key=value`` text: JSON first (``2``, ``true``, ``"x"``, ``{...}``), else the string."""
    try:
        return json.loads(text)
    except (ValueError, RecursionError):
        return text


def build_options(cls: type, data: Mapping[str, Any] | None, *, owner: str) -> Any:
    """Build an attrs options class from a plain mapping, raising InvalidArgumentError.

    Unknown keys name the nearest valid key; validator errors are prefixed with ``owner`` (e.g.
    ``backend 'cpu'``) so the user knows which options class complained.
    """
    data = dict(data or {})
    names = [a.alias if getattr(a, "alias", None) else a.name for a in attrs.fields(cls)]
    try:
        v.check_keys(data, names, what=f"option of {owner}")
        return cls(**data)
    except InvalidArgumentError as e:
        msg = str(e)
        if not msg.startswith(owner):
            msg = f"{owner}: {msg}"
        raise InvalidArgumentError(msg) from None
    except (TypeError, ValueError) as e:
        raise InvalidArgumentError(f"{owner}: {e}") from e
