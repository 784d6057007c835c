"""The result schema: plain, immutable, serialisable profile data.

A :class:`ProfileResult` holds run metadata and one :class:`BackendResult` per backend. Everything
is an ``attrs.frozen`` class of ints, floats, strings, tuples and JSON-ready mappings, so
``ProfileResult.from_dict(r.to_dict()) == r`` and ``load(save(r)) == r`` hold exactly.

Conventions:
    * Times are integer nanoseconds. Each ``BackendResult`` has its own :class:`ClockInfo`;
      ``t + clock.offset_ns`` puts a time on the run's reference clock (the Profiler's
      ``time.perf_counter_ns``), so parts line up on one timeline.
    * Stacks are tuples of frame indices, root (outermost) first, leaf last.
    * ``Span.track`` / ``CounterSeries.track`` / ``Instant.track`` are ``Track.id`` values.
    * Anything not recorded is counted in ``losses``: nothing is dropped silently.

The JSON Schema of ``to_dict()`` is ``docs/schema/profile-result.schema.json``.
"""

from __future__ import annotations

import functools
import json
import math
import os
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any

import attrs

from omniprof.core.validators import to_tuple
from omniprof.errors import InvalidArgumentError, TraceReadError

__all__ = [
    "SCHEMA_VERSION", "Frame", "ThreadInfo", "TaskInfo", "Track", "Span", "Instant", "Flow",
    "StackSample", "CounterSeries", "Allocation", "Table", "Loss", "ErrorRecord", "Artifact",
    "ClockInfo", "BackendResult", "RunMetadata", "ProfileResult", "load", "json_safe", "READABLE_VERSIONS",
]

SCHEMA_VERSION = 2
#: Versions :meth:`ProfileResult.from_dict` reads; older ones are brought up to ``SCHEMA_VERSION``
#: (version 1 had no ``Track.stream``: it is taken from the track's id or name, see ``_converter``).
READABLE_VERSIONS = (1, 2)


def json_safe(value: Any) -> Any:
    """Normalise a value to what JSON round-trips exactly: dict/list/str/int/float/bool/None.

    Tuples become lists and mapping keys strings; NaN and infinities become strings ("nan",
    "inf", "-inf") because JSON has no spelling for them.
    """
    if value is None or isinstance(value, (bool, int, str)):
        return value
    if isinstance(value, float):
        if math.isfinite(value):
            return value
        return "nan" if value != value else ("inf" if value > 0 else "-inf")
    if isinstance(value, Mapping):
        return {str(k): json_safe(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [json_safe(v) for v in value]
    if isinstance(value, bytes):
        return value.decode("utf-8", "replace")
    return str(value)


def _args(value: Any) -> Mapping[str, Any]:
    return json_safe(dict(value or {}))


def _ints(value: Any) -> tuple[int, ...]:
    return tuple(int(x) for x in value)


def _floats(value: Any) -> tuple[float, ...]:
    return tuple(float(x) for x in value)


def _tuple_of(cls: type) -> Any:
    def convert(value: Any) -> tuple:
        return tuple(x if isinstance(x, cls) else _structure(cls, x) for x in (value or ()))
    return convert


@attrs.frozen
class Frame:
    """One stack frame.

    Attributes:
        name: function name (qualified where known, e.g. ``Class.method``).
        file: source file path ('' when unknown, e.g. native code).
        line: line number (0 when unknown). With ``combine=False`` reports keep lines apart.
        module: module or shared-library name, when known.
        kind: ``"py"`` Python, ``"native"`` C/C++, ``"gc"``/``"runtime"`` pseudo-frames.
        offset: bytecode offset (Python) or instruction address (native) within the function, when
            recorded; frames on one line with different offsets are kept apart by
            ``combine=False`` reports (Julia's instruction pointers). None when unknown.
    """

    name: str
    file: str = ""
    line: int = 0
    module: str | None = None
    kind: str = "py"
    offset: int | None = None


@attrs.frozen
class ThreadInfo:
    """A thread seen by a backend: ``thread_id`` (Python ident or backend id), name, OS id."""

    thread_id: int
    name: str
    native_id: int | None = None


@attrs.frozen
class TaskInfo:
    """An asyncio task (or other green thread): id, name, and the thread it ran on."""

    task_id: int
    name: str
    thread_id: int | None = None


@attrs.frozen
class Track:
    """A timeline row.

    Attributes:
        id: unique within the result's part, referenced by spans/counters/instants.
        name: shown to users ("MainThread", "/device:GPU:0 stream 7").
        kind: ``"thread"``, ``"process"``, ``"device"``, ``"stream"``, ``"counter"`` or ``"other"``.
        process: process or host name the track belongs to (groups tracks in viewers).
        pid, tid: OS ids when known.
        device: device index when the track is on an accelerator.
        stream: the device's stream (CUDA stream, XLA GPU stream line) the track shows, when known.

    .. versionchanged:: 0.2 ``stream`` (result schema version 2).
    """

    id: str
    name: str
    kind: str = "thread"
    process: str | None = None
    pid: int | None = None
    tid: int | None = None
    device: int | None = None
    stream: int | None = None


@attrs.frozen
class Span:
    """A timed interval on a track: op, kernel, annotation, step, Python call.

    ``category`` is free text with these common values: ``"annotation"``, ``"step"``, ``"xla_op"``,
    ``"xla_module"``, ``"kernel"``, ``"memcpy"``, ``"memset"``, ``"cpu_op"``, ``"runtime"``,
    ``"python"``, ``"gc"``. ``args`` holds extra JSON data (``hlo_op``, grid, block, shapes, ...).
    ``flow_ids`` links this span to others sharing an id (CPU launch -> GPU kernel).
    """

    name: str
    track: str
    start_ns: int
    dur_ns: int
    category: str = ""
    args: Mapping[str, Any] = attrs.field(factory=dict, converter=_args)
    flow_ids: tuple[int, ...] = attrs.field(default=(), converter=_ints)

    @property
    def end_ns(self) -> int:
        return self.start_ns + self.dur_ns


@attrs.frozen
class Instant:
    """A point event on a track (a marker, a GC, a buffer-full notice)."""

    name: str
    track: str
    t_ns: int
    category: str = ""
    args: Mapping[str, Any] = attrs.field(factory=dict, converter=_args)


@attrs.frozen
class Flow:
    """A named flow (arrow) between spans whose ``flow_ids`` contain ``flow_id``."""

    flow_id: int
    name: str = ""
    category: str = ""


@attrs.frozen
class StackSample:
    """One sample of one thread's stack.

    Attributes:
        t_ns: when it was taken (this part's clock).
        thread_id: a ``ThreadInfo.thread_id`` of the same part.
        stack_id: index into ``BackendResult.stacks``.
        weight_ns: time this sample stands for (time since the thread's previous sample), so a
            long C call whose signals coalesced still counts in full.
        task_id: a ``TaskInfo.task_id`` or None.
        idle: the thread was not on a CPU when sampled (sleeping, waiting for I/O, a lock or the
            GIL); recorded by the native engine (``wall`` mode), False where unknown.
    """

    t_ns: int
    thread_id: int
    stack_id: int
    weight_ns: int
    task_id: int | None = None
    idle: bool = False


@attrs.frozen
class CounterSeries:
    """Values of one counter over time (NVML power, memory used, sampler rate, ...)."""

    name: str
    unit: str
    track: str
    t_ns: tuple[int, ...] = attrs.field(converter=_ints)
    values: tuple[float, ...] = attrs.field(converter=_floats)

    def __attrs_post_init__(self) -> None:
        if len(self.t_ns) != len(self.values):
            raise InvalidArgumentError(
                f"counter {self.name!r} has {len(self.t_ns)} timestamps but {len(self.values)} values"
            )


@attrs.frozen
class Allocation:
    """One sampled allocation: size, stack, and whether it was still alive at the end.

    ``size_bytes`` is the size of the one allocation recorded; ``count`` is how many allocations
    it stands for under sampling (1 when exact), so ``size_bytes * count`` estimates the bytes.
    ``type`` is the class of the object allocated when the block held one (Julia's
    ``Alloc.type``), else None; ``domain`` the allocator it came from (``"obj"``, ``"mem"``,
    ``"raw"``; None when unknown).
    """

    t_ns: int
    size_bytes: int
    stack_id: int
    thread_id: int | None = None
    alive_at_end: bool = False
    count: int = 1
    type: str | None = None
    domain: str | None = None


@attrs.frozen
class Table:
    """A derived table (op stats, kernel stats, ...): plain rows, formatted by reporters.

    Attributes:
        name: ``"op_stats"``, ``"kernel_stats"``, ``"framework_op_stats"``, ...
        columns: column names; units go in the names (``total_ns``, ``peak_bytes``).
        rows: tuples of JSON scalars, one per row, in ``columns`` order.
        title: a human title.
    """

    name: str
    columns: tuple[str, ...] = attrs.field(converter=to_tuple)
    rows: tuple[tuple[Any, ...], ...] = attrs.field(converter=lambda rows: tuple(tuple(json_safe(list(r))) for r in rows))
    title: str = ""

    def records(self) -> list[dict[str, Any]]:
        return [dict(zip(self.columns, r)) for r in self.rows]

    def column(self, name: str) -> list[Any]:
        i = self.columns.index(name)
        return [r[i] for r in self.rows]


@attrs.frozen
class Loss:
    """Data that was not recorded, counted. ``kind``: ``"samples_dropped"``, ``"events_dropped"``,
    ``"buffer_full"``, ``"truncated"``, ``"size_limit"``, ... ``count`` in ``unit``."""

    source: str
    kind: str
    count: int
    unit: str = "events"
    detail: str = ""


@attrs.frozen
class ErrorRecord:
    """A failure recorded in the result (backend failed to start/stop, workload raised)."""

    source: str
    phase: str
    type: str
    message: str

    @property
    def what(self) -> str:
        """``Type: message``, or the type alone where the error said nothing (``KeyboardInterrupt``),
        as every view shows it."""
        return f"{self.type}: {self.message}" if self.message else self.type


@attrs.frozen
class Artifact:
    """A native file a backend produced (``xplane.pb``, Kineto JSON), by path."""

    kind: str
    path: str
    description: str = ""


@attrs.frozen
class ClockInfo:
    """A part's clock: ``name`` (e.g. ``perf_counter_ns``), and the offset that maps its times
    onto the run's reference clock."""

    name: str = "perf_counter_ns"
    offset_ns: int = 0


@attrs.frozen
class BackendResult:
    """What one backend recorded in one session.

    Attributes:
        backend: the backend's name.
        clock: how this part's times map onto the run's reference clock.
        start_ns, end_ns: session bounds on this part's clock.
        tracks, spans, instants, flows: timeline data.
        frames, stacks: frame table and stack table (stacks are root-first frame indices).
        threads, tasks: who was sampled.
        samples: stack samples. allocations: sampled allocations.
        counters: counter series.
        tables: derived tables. summaries: named flat mappings (``"flops"``, ``"memory"``, ``"overhead"``).
        losses: everything not recorded, counted.
        artifacts: native files produced.
        metadata: backend facts (versions, devices, effective options, engine).
    """

    backend: str
    clock: ClockInfo = attrs.field(factory=ClockInfo, converter=lambda c: c if isinstance(c, ClockInfo) else _structure(ClockInfo, c))
    start_ns: int = 0
    end_ns: int = 0
    tracks: tuple[Track, ...] = attrs.field(default=(), converter=_tuple_of(Track))
    spans: tuple[Span, ...] = attrs.field(default=(), converter=_tuple_of(Span))
    instants: tuple[Instant, ...] = attrs.field(default=(), converter=_tuple_of(Instant))
    flows: tuple[Flow, ...] = attrs.field(default=(), converter=_tuple_of(Flow))
    frames: tuple[Frame, ...] = attrs.field(default=(), converter=_tuple_of(Frame))
    stacks: tuple[tuple[int, ...], ...] = attrs.field(default=(), converter=lambda s: tuple(_ints(x) for x in s))
    threads: tuple[ThreadInfo, ...] = attrs.field(default=(), converter=_tuple_of(ThreadInfo))
    tasks: tuple[TaskInfo, ...] = attrs.field(default=(), converter=_tuple_of(TaskInfo))
    samples: tuple[StackSample, ...] = attrs.field(default=(), converter=_tuple_of(StackSample))
    allocations: tuple[Allocation, ...] = attrs.field(default=(), converter=_tuple_of(Allocation))
    counters: tuple[CounterSeries, ...] = attrs.field(default=(), converter=_tuple_of(CounterSeries))
    tables: tuple[Table, ...] = attrs.field(default=(), converter=_tuple_of(Table))
    summaries: Mapping[str, Mapping[str, Any]] = attrs.field(factory=dict, converter=_args)
    losses: tuple[Loss, ...] = attrs.field(default=(), converter=_tuple_of(Loss))
    artifacts: tuple[Artifact, ...] = attrs.field(default=(), converter=_tuple_of(Artifact))
    metadata: Mapping[str, Any] = attrs.field(factory=dict, converter=_args)

    def table(self, name: str) -> Table | None:
        return next((t for t in self.tables if t.name == name), None)

    def stack_frames(self, stack_id: int) -> tuple[Frame, ...]:
        return tuple(self.frames[i] for i in self.stacks[stack_id])

    def thread_name(self, thread_id: int) -> str:
        for t in self.threads:
            if t.thread_id == thread_id:
                return t.name
        return f"thread {thread_id}"


@attrs.frozen
class RunMetadata:
    """Facts about the run: who, where, when, with what.

    ``start_unix_ns`` and ``start_ns`` are the same instant on the wall clock and on the reference
    clock, so any reference time converts to wall time.

    ``distributed`` is empty for a single process. In a rank's result of a distributed run it holds
    ``rank``, ``world_size``, ``local_rank``, ``launcher``, ``run`` and the clock estimate
    (``clock_offset_ns``, ``clock_uncertainty_ns``, ``clock_delay_ns``, ``clock_rounds``: this
    rank's reference time plus the offset is rank 0's); in a merged result ``merged: true``,
    ``world_size`` and one row per rank under ``ranks`` (docs/distributed.md).
    """

    host: str = ""
    pid: int = 0
    argv: tuple[str, ...] = attrs.field(default=(), converter=to_tuple)
    python: str = ""
    platform: str = ""
    versions: Mapping[str, Any] = attrs.field(factory=dict, converter=_args)
    devices: tuple[Mapping[str, Any], ...] = attrs.field(default=(), converter=lambda d: tuple(_args(x) for x in d))
    backends: tuple[str, ...] = attrs.field(default=(), converter=to_tuple)
    options: Mapping[str, Any] = attrs.field(factory=dict, converter=_args)
    backend_options: Mapping[str, Any] = attrs.field(factory=dict, converter=_args)
    start_unix_ns: int = 0
    start_ns: int = 0
    end_ns: int = 0
    label: str = ""
    distributed: Mapping[str, Any] = attrs.field(factory=dict, converter=_args)


@attrs.frozen
class ProfileResult:
    """A whole profiling session: metadata plus one part per backend.

    ``partial`` is True when the session did not end normally (workload raised, a backend failed,
    the process was interrupted); ``errors`` says what happened.

    >>> r = ProfileResult(parts=(BackendResult(backend="cpu"),))
    >>> ProfileResult.from_dict(r.to_dict()) == r
    True

    .. versionadded:: 0.1
    """

    metadata: RunMetadata = attrs.field(factory=RunMetadata, converter=lambda m: m if isinstance(m, RunMetadata) else _structure(RunMetadata, m))
    parts: tuple[BackendResult, ...] = attrs.field(default=(), converter=_tuple_of(BackendResult))
    partial: bool = False
    errors: tuple[ErrorRecord, ...] = attrs.field(default=(), converter=_tuple_of(ErrorRecord))
    schema_version: int = SCHEMA_VERSION

    # -- access -------------------------------------------------------------------------------
    def part(self, backend: str) -> BackendResult:
        for p in self.parts:
            if p.backend == backend:
                return p
        raise KeyError(f"no part from backend {backend!r} (parts: {', '.join(p.backend for p in self.parts) or 'none'})")

    @property
    def losses(self) -> tuple[Loss, ...]:
        return tuple(loss for p in self.parts for loss in p.losses)

    def tables(self, name: str) -> Iterator[tuple[BackendResult, Table]]:
        for p in self.parts:
            for t in p.tables:
                if t.name == name:
                    yield p, t

    def evolve(self, **changes: Any) -> ProfileResult:
        return attrs.evolve(self, **changes)

    # -- serialisation ------------------------------------------------------------------------
    def to_dict(self) -> dict[str, Any]:
        return _unstructure(self)

    @classmethod
    def from_dict(cls, data: Mapping[str, Any], *, check: bool = True) -> ProfileResult:
        if not isinstance(data, Mapping):
            raise TraceReadError(f"a result must be a JSON object (got {type(data).__name__})")
        version = data.get("schema_version")
        if version not in READABLE_VERSIONS or isinstance(version, bool):
            raise TraceReadError(
                f"unsupported result schema_version {version!r}; this omniprof reads versions "
                f"{', '.join(map(str, READABLE_VERSIONS))}"
            )
        data = _upgrade_tables(data)
        try:
            result = _structure(cls, data, version=int(version))
        except TraceReadError:
            raise
        except (TypeError, ValueError, KeyError, AttributeError, OverflowError, IndexError) as e:
            raise TraceReadError(f"malformed result: {_first_line(e)}") from e
        except RecursionError as e:
            raise TraceReadError("malformed result: values nested too deeply") from e
        problem = _reference_problem(result) if check else None
        if problem:
            raise TraceReadError(f"malformed result: {problem}")
        return result

    def to_json(self, *, indent: int | None = None) -> str:
        """The result as JSON text that encodes to valid UTF-8.

        Text that is not valid Unicode (a file name of undecodable bytes, kept by Python as lone
        surrogates: ``caf\\udce9.py``) is written as JSON ``\\u`` escapes, which read back to the
        same string (and so to the same file name through ``os.fsencode``).
        """
        return _dumps(self.to_dict(), indent)

    def _checked_json(self, path: Path) -> str:
        try:
            tree = self.to_dict()
            _check_loads(tree)  # what load() would refuse, refused before writing
            text = _dumps(tree)
        except (TraceReadError, TypeError, ValueError, OverflowError, RecursionError) as e:
            import errno

            from omniprof.errors import OutputError

            problems = _first_line(e).removeprefix("malformed result: ").split("; ")
            why = problems[0] + (f"; {len(problems) - 1} more" if len(problems) > 1 else "")
            err = OutputError(f"result not saved to {str(path)!r}: it would not load back ({why})")
            err.errno, err.filename = errno.EINVAL, str(path)
            raise err from e
        return text

    def save(self, path: str | os.PathLike[str]) -> Path:
        """Write the result as JSON (gzipped when the name ends in ``.gz``), atomically.

        The result is checked first the way :func:`load` reads it: a result that would not load
        back (a value of the wrong type, a time beyond 64 bits) is never written; an
        :class:`~omniprof.errors.OutputError` names the first bad field instead.

        Returns the path written.
        """
        from omniprof.core.fileio import atomic_write_bytes

        path = Path(path)
        data = self._checked_json(path).encode("utf-8")
        if path.name.endswith(".gz"):
            import gzip

            data = gzip.compress(data, compresslevel=6, mtime=0)
        atomic_write_bytes(path, data)
        return path


# The long lists of a part, checked column by column (structuring them as load() does doubled
# the time of a save: 10 s instead of 5 s for 600,000 events); everything else is structured.
_BULK = ("samples", "spans", "instants", "allocations")
_INT64 = (-(1 << 63), 1 << 63)


def _check_loads(tree: dict[str, Any]) -> None:
    """Raise what :func:`load` would raise reading ``tree`` (a :meth:`ProfileResult.to_dict`)."""
    parts = tree.get("parts") or []
    result = ProfileResult.from_dict({**tree, "parts": [{**p, **{k: [] for k in _BULK}} for p in parts]},
                                     check=False)
    for i, p in enumerate(parts):
        for key in _BULK:
            if p[key]:
                _check_rows(f"parts[{i}].{key}", p[key], _declared(key))
    problem = _reference_problem(result, bulk=parts)
    if problem:
        raise TraceReadError(f"malformed result: {problem}")


def _declared(key: str) -> dict[str, str]:
    cls = {"samples": StackSample, "spans": Span, "instants": Instant, "allocations": Allocation}[key]
    return {a.name: str(a.type) for a in attrs.fields(cls)}


def _check_rows(where: str, rows: list[dict[str, Any]], declared: dict[str, str]) -> None:
    for name, kind in declared.items():
        try:
            column = [r[name] for r in rows]
        except (KeyError, TypeError):
            raise TraceReadError(f"malformed result: {where}: a row without {name!r}") from None
        base = kind.replace("<class '", "").replace("'>", "").split(" |")[0].split("[")[0]
        allowed = {"int": {int}, "tuple": {int}, "str": {str}, "bool": {bool}}.get(base, {dict})
        if base == "tuple":
            column = [v for t in column for v in t]
        kinds = set(map(type, column)) - ({type(None)} if "None" in kind else set())
        if not kinds <= allowed:
            what = {"int": "integers", "tuple": "integers", "str": "strings", "bool": "booleans"}.get(base, "objects")
            got = ", ".join(sorted(t.__name__ for t in kinds - allowed))
            raise TraceReadError(f"malformed result: {where}[].{name} must be {what} (got {got})")
        if allowed == {int} and column:
            values = [v for v in column if v is not None] if "None" in kind else column
            if values and not (_INT64[0] <= min(values) and max(values) < _INT64[1]):
                raise TraceReadError(f"malformed result: {where}[].{name} is outside the signed 64-bit range")
        elif allowed == {dict} and not all(isinstance(k, str) for v in column for k in v):
            raise TraceReadError(f"malformed result: {where}[].{name} must be objects with string keys")


def _dumps(data: Any, indent: int | None = None) -> str:
    text = json.dumps(data, indent=indent, allow_nan=False, ensure_ascii=False)
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        text = json.dumps(data, indent=indent, allow_nan=False, ensure_ascii=True)
    return text


def _upgrade_tables(data: Mapping[str, Any]) -> Mapping[str, Any]:
    """Op tables saved with an older column set get the vocabulary's names (core.opstats); the rest
    is left as it is (malformed data is the structuring step's to report)."""
    from omniprof.core.opstats import upgrade_columns

    parts = data.get("parts")
    if not isinstance(parts, list):
        return data
    new_parts = []
    changed = False
    for part in parts:
        tables = part.get("tables") if isinstance(part, Mapping) else None
        if isinstance(tables, list):
            new_tables = []
            for t in tables:
                if isinstance(t, Mapping) and isinstance(t.get("name"), str) and isinstance(t.get("columns"), list) \
                        and all(isinstance(c, str) for c in t["columns"]):
                    cols = list(upgrade_columns(t["name"], t["columns"]))
                    if cols != t["columns"]:
                        t = {**t, "columns": cols}
                        changed = True
                new_tables.append(t)
            part = {**part, "tables": new_tables}
        new_parts.append(part)
    return {**data, "parts": new_parts} if changed else data


def load(path: str | os.PathLike[str]) -> ProfileResult:
    """Read a result saved by :meth:`ProfileResult.save` (plain or gzipped JSON). Never runs code."""
    from omniprof.core.inputs import read_input

    path = Path(path)
    raw = read_input(path)  # bounded: size, gzip ratio; pipes, devices and link loops each named
    try:
        data = json.loads(raw)
    except UnicodeDecodeError as e:
        raise TraceReadError(f"{path}: not UTF-8 text at byte {e.start}") from e
    except json.JSONDecodeError as e:
        raise TraceReadError(f"{path}: invalid JSON at line {e.lineno} column {e.colno} (char {e.pos}): {e.msg}") from e
    except RecursionError as e:
        raise TraceReadError(f"{path}: JSON nested too deeply") from e
    except ValueError as e:  # e.g. an integer of more than 4,300 digits (Python's int/str conversion bound)
        why = ("a number of more than 4,300 digits (the bound Python puts on reading integers)"
               if "4300" in str(e) else _first_line(e))
        raise TraceReadError(f"{path}: invalid JSON: {why}") from e
    try:
        return ProfileResult.from_dict(data)
    except TraceReadError as e:
        raise TraceReadError(f"{path}: {e}") from e


def _short(value: Any) -> str:
    text = repr(value) if not isinstance(value, int) or value.bit_length() < 200 else f"an integer of {value.bit_length()} bits"
    return text if len(text) <= 80 else text[:77] + "..."


def _first_line(e: BaseException) -> str:
    text = str(e).strip().splitlines()
    return text[0] if text else type(e).__name__


def _reference_problem(result: ProfileResult, bulk: Sequence[Mapping[str, Any]] | None = None) -> str | None:
    """The first index in ``result`` that points nowhere (reporters rely on every one), or the
    first negative amount. ``bulk``: each part's long lists as plain rows (a result being saved,
    whose parts were structured without them)."""
    for name in ("backends", "argv"):
        for j, item in enumerate(getattr(result.metadata, name)):
            if not isinstance(item, str):
                return f"metadata.{name}[{j}] must be a string (got {item!r})"
    for i, part in enumerate(result.parts):
        where = f"parts[{i}] ({part.backend})"
        n_frames, n_stacks = len(part.frames), len(part.stacks)
        for key, summary in part.summaries.items():
            if not isinstance(summary, Mapping):
                return f"{where}.summaries[{key!r}] must be an object of named values (got {summary!r})"
        for j, stack in enumerate(part.stacks):
            for f in stack:
                if not 0 <= f < n_frames:
                    return f"{where}.stacks[{j}] refers to frame {f}, but there are {n_frames} frames"
        rows = bulk[i] if bulk is not None else None

        def column(key: str, name: str) -> list[Any]:
            return [r[name] for r in rows[key]] if rows is not None else [getattr(x, name) for x in getattr(part, key)]

        # stack ids in range; negative amounts mean nothing (no reader gives them) and break the
        # viewers they reach (speedscope refuses the file)
        for key, name, lo, hi, why in (
                ("samples", "stack_id", 0, n_stacks, f"there are {n_stacks} stacks"),
                ("allocations", "stack_id", 0, n_stacks, f"there are {n_stacks} stacks"),
                ("spans", "dur_ns", 0, None, "a duration cannot be negative"),
                ("allocations", "size_bytes", 0, None, "a size cannot be negative"),
                ("allocations", "count", 0, None, "a count cannot be negative")):
            values = column(key, name)
            if values and (min(values) < lo or (hi is not None and max(values) >= hi)):
                j, bad = next((j, v) for j, v in enumerate(values) if v < lo or (hi is not None and v >= hi))
                return f"{where}.{key}[{j}].{name} is {bad}, but {why}"
    return None


# -- (un)structuring: cattrs by the declared field types; no pickle, no eval -----------------------
@functools.lru_cache(maxsize=None)
def _converter(version: int = SCHEMA_VERSION) -> Any:
    """The cattrs converter of the result schema (of ``version``), built on first use (``import
    omniprof`` stays light).

    Version 1 (no ``Track.stream``) is read by the same hooks plus one for ``Track``: a device or
    stream track gets the ``stream`` and ``device`` its id or name spell (``device:0:stream:7``,
    ``GPU 0 stream 7``, XProf's ``Stream #7``), the rule reporters applied to version-1 files; the
    result is then a version-2 result.

    Unstructuring writes tuples as lists and non-finite floats as "nan"/"inf"/"-inf". Structuring
    refuses unknown keys and JSON values of the wrong type for ``int``/``str``/``bool`` fields
    (``true`` is no integer, ``2.0`` no integer, ``1`` no string); the classes' own converters and
    validators then normalise and check the values.
    """
    import cattrs

    conv = cattrs.Converter(forbid_extra_keys=True,
                            unstruct_collection_overrides={Sequence: list, tuple: list})
    conv.register_unstructure_hook(float, lambda x: x if math.isfinite(x) else json_safe(x))

    def scalar(kind: type, what: str) -> Any:
        def structure(value: Any, _: Any) -> Any:
            if not isinstance(value, kind) or (kind is int and isinstance(value, bool)):
                raise TypeError(f"must be {what} (got {_short(value)})")
            if kind is int and not -(1 << 63) <= value < 1 << 63:
                raise TypeError(f"is outside the signed 64-bit range (got {_short(value)})")
            return value
        return structure

    conv.register_structure_hook(int, scalar(int, "an integer"))
    conv.register_structure_hook(str, scalar(str, "a string"))
    conv.register_structure_hook(bool, scalar(bool, "a boolean"))
    conv.register_structure_hook(float, lambda v, _: float(v))  # numbers, and "nan"/"inf" as written
    # typing.Any by identity: before 3.11 it is no class, and a class-keyed hook refuses it.
    conv.register_structure_hook_func(lambda t: t is Any, lambda v, _: v)
    for cls in (Frame, ThreadInfo, TaskInfo, Track, Span, Instant, Flow, StackSample, CounterSeries, Allocation,
                Table, Loss, ErrorRecord, Artifact, ClockInfo, BackendResult, RunMetadata, ProfileResult):
        attrs.resolve_types(cls, globals())
    if version == 1:
        from cattrs.gen import make_dict_structure_fn

        track_v2 = make_dict_structure_fn(Track, conv, _cattrs_forbid_extra_keys=True)
        conv.register_structure_hook(Track, lambda d, t: track_v2(_track_v1(d), t))
        result_v2 = make_dict_structure_fn(ProfileResult, conv, _cattrs_forbid_extra_keys=True)
        conv.register_structure_hook(ProfileResult, lambda d, t: result_v2({**d, "schema_version": SCHEMA_VERSION}, t))
    return conv


def _track_v1(data: Any) -> Any:
    import re

    if not isinstance(data, Mapping) or data.get("kind") not in ("device", "stream") or "stream" in data:
        return data
    out = dict(data)
    m = re.search(r"stream[:_ #]*(\d+)", f"{data.get('id', '')} {data.get('name', '')}", re.IGNORECASE)
    out["stream"] = int(m.group(1)) if m else None
    if out.get("device") is None:
        d = re.search(r"(?:device|gpu)[:_ ]?(\d+)", str(data.get("id", "")), re.IGNORECASE)
        out["device"] = int(d.group(1)) if d else None
    return out


def _unstructure(obj: Any) -> Any:
    return _converter().unstructure(obj)


def warm_converter() -> None:
    """Build the schema's converter and its per-class hooks now (cattrs writes them on first use:
    ~30 ms of compiling), so the first result or checkpoint written later does not pay for it."""
    _unstructure(ProfileResult(metadata=RunMetadata(), parts=(BackendResult(backend="warm"),)))


def _structure(cls: type, data: Any, version: int = SCHEMA_VERSION) -> Any:
    if not isinstance(data, Mapping):
        raise TypeError(f"expected an object for {cls.__name__}, got {type(data).__name__}")
    import cattrs

    try:
        return _converter(version).structure(data, cls)
    except cattrs.BaseValidationError as e:
        raise TypeError("; ".join(cattrs.transform_error(e, path=cls.__name__, format_exception=_why))) from e


def _why(exc: BaseException, type_: Any) -> str:
    if isinstance(exc, _extra_keys_error()):
        return f"unknown field(s) {sorted(exc.extra_fields)}"
    if isinstance(exc, KeyError):
        return "required field missing"
    return str(exc) or type(exc).__name__


def _extra_keys_error() -> type:
    from cattrs.errors import ForbiddenExtraKeysError

    return ForbiddenExtraKeysError
