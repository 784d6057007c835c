"""CUPTI activity records -> the result schema: caps with counted drops, spans, flows, occupancy.

Input is the plain records of :mod:`omniprof.backends.cupti.cupti_adapter` (real CUPTI, or a fake
replaying recorded ones). Nothing here imports ``cupti``.
"""

from __future__ import annotations

import math
import threading
from collections.abc import Callable, Iterable, Mapping
from typing import Any

from omniprof.core.results import Flow, Instant, Loss, Span, Track

__all__ = ["ActivityCollector", "MEMCPY_KINDS", "SYNC_TYPES", "build_timeline", "occupancy_pct", "DEVICE_KINDS",
           "API_KINDS"]

#: CUpti_ActivityMemcpyKind -> the short names Kineto and Nsight use.
MEMCPY_KINDS = {0: "Unknown", 1: "HtoD", 2: "DtoH", 3: "HtoA", 4: "AtoH", 5: "AtoA", 6: "AtoD", 7: "DtoA", 8: "DtoD",
                9: "HtoH", 10: "PtoP"}
#: CUpti_ActivitySynchronizationType -> name.
SYNC_TYPES = {0: "unknown", 1: "event_synchronize", 2: "stream_wait_event", 3: "stream_synchronize",
              4: "context_synchronize"}

#: record kinds capped by ``gpu_max_activity_api_events`` (device-side activity).
DEVICE_KINDS = frozenset({"kernel", "memcpy", "memset", "sync", "graph"})
#: record kinds capped by ``gpu_max_callback_api_events`` (host-side CUDA API calls).
API_KINDS = frozenset({"runtime", "driver"})

MARKER_INSTANTANEOUS = 1
MARKER_START = 2


class ActivityCollector:
    """Receives record batches (from CUPTI's buffer-completed callback thread) and keeps them
    within the event caps, counting what it drops.

    Args:
        max_activity_events: device records kept (kernels, memcpy, memset, sync, graphs).
        max_api_events: CUDA runtime/driver API records kept.
        max_annotation_strings: distinct NVTX/annotation names kept; markers with a new name
            beyond the cap are dropped and counted.
        devices: device ids to keep (None: all); records of other devices are filtered out
            (counted in :attr:`filtered`, not a loss: the user asked for it).
        kinds: record kinds to keep (others are ignored; CUPTI may deliver kinds enabled by
            another part of the process).
    """

    def __init__(self, *, max_activity_events: int, max_api_events: int, max_annotation_strings: int,
                 devices: Iterable[int] | None = None, kinds: Iterable[str] | None = None) -> None:
        self.max_activity_events = max_activity_events
        self.max_api_events = max_api_events
        self.max_annotation_strings = max_annotation_strings
        self.devices = None if devices is None else frozenset(devices)
        self.kinds = None if kinds is None else frozenset(kinds)
        self.records: list[dict[str, Any]] = []
        self.device_info: dict[int, dict[str, Any]] = {}
        self.overhead_ns: dict[int, int] = {}
        self.names: set[str] = set()
        self.counts: dict[str, int] = {}
        self.dropped: dict[str, int] = {"activity": 0, "api": 0, "annotation_strings": 0, "cupti": 0}
        self.filtered = 0
        self._n_device = 0
        self._n_api = 0
        self._open_markers: dict[int, str] = {}
        self._lock = threading.Lock()

    def add(self, records: Iterable[Mapping[str, Any]]) -> None:
        with self._lock:
            for r in records:
                self._add(r)

    def add_cupti_dropped(self, n: int) -> None:
        """Records CUPTI itself dropped for lack of buffer space."""
        if n:
            with self._lock:
                self.dropped["cupti"] += int(n)

    def _add(self, r: Mapping[str, Any]) -> None:
        kind = r.get("kind")
        if kind == "device":
            self.device_info[int(r["id"])] = dict(r)
            return
        if kind == "overhead":
            k = int(r.get("overhead_kind", 0))
            self.overhead_ns[k] = self.overhead_ns.get(k, 0) + max(int(r["end"]) - int(r["start"]), 0)
            return
        if self.kinds is not None and kind not in self.kinds:
            return
        if self.devices is not None and "device_id" in r and int(r["device_id"]) not in self.devices:
            self.filtered += 1
            return
        if kind in DEVICE_KINDS:
            if self._n_device >= self.max_activity_events:
                self.dropped["activity"] += 1
                return
            self._n_device += 1
        elif kind in API_KINDS:
            if self._n_api >= self.max_api_events:
                self.dropped["api"] += 1
                return
            self._n_api += 1
        elif kind == "marker":
            if not self._keep_marker(r):
                return
        else:
            return
        self.counts[kind] = self.counts.get(kind, 0) + 1
        self.records.append(dict(r))

    def _keep_marker(self, r: Mapping[str, Any]) -> bool:
        flags = int(r.get("flags", 0))
        mid = int(r.get("id", 0))
        if flags & (MARKER_START | MARKER_INSTANTANEOUS):
            name = str(r.get("name", ""))
            if name not in self.names:
                if len(self.names) >= self.max_annotation_strings:
                    self.dropped["annotation_strings"] += 1
                    return False
                self.names.add(name)
            if flags & MARKER_START:
                self._open_markers[mid] = name
            return True
        # an end record: keep it only when its start was kept
        return self._open_markers.pop(mid, None) is not None

    def note_annotation(self, name: str) -> bool:
        """Count an omniprof annotation string against the cap; False when it must be dropped."""
        with self._lock:
            if name in self.names:
                return True
            if len(self.names) >= self.max_annotation_strings:
                self.dropped["annotation_strings"] += 1
                return False
            self.names.add(name)
            return True

    def losses(self) -> list[Loss]:
        out = []
        d = self.dropped
        if d["activity"]:
            out.append(Loss("cupti", "events_dropped", d["activity"], "events",
                            f"gpu_max_activity_api_events={self.max_activity_events} reached: later kernel, memcpy, "
                            f"memset, sync and graph records were dropped"))
        if d["api"]:
            out.append(Loss("cupti", "events_dropped", d["api"], "events",
                            f"gpu_max_callback_api_events={self.max_api_events} reached: later CUDA API call records "
                            f"were dropped"))
        if d["annotation_strings"]:
            out.append(Loss("cupti", "truncated", d["annotation_strings"], "annotations",
                            f"gpu_max_annotation_strings={self.max_annotation_strings} distinct names reached: "
                            f"annotations with new names were dropped"))
        if d["cupti"]:
            out.append(Loss("cupti", "buffer_full", d["cupti"], "events",
                            "CUPTI dropped activity records for lack of buffer space (raise activity_buffer_bytes)"))
        return out


def occupancy_pct(block: Any, grid: Any, registers_per_thread: int, shared_memory_bytes: int,
                  device: Mapping[str, Any]) -> float | None:
    """Estimated achieved occupancy of a launch, in percent, from the device's limits.

    Theoretical occupancy (resident warps per SM over the maximum, limited by warps, blocks,
    registers and shared memory per SM, with the CUDA occupancy calculator's register allocation
    unit of 256 registers per warp and the 1 KiB of shared memory the driver reserves per block on
    sm_80 and later; shared-memory allocation granularity ignored) times the fraction of the
    device's block slots the grid can fill, so a one-block launch on a big GPU scores low. None
    when the device's limits or the launch shape are unknown.
    """
    try:
        threads = math.prod(int(x) for x in block)
        blocks = math.prod(int(x) for x in grid)
        warp = int(device.get("num_threads_per_warp") or 32)
        max_warps = int(device["max_warps_per_multiprocessor"])
        max_blocks = int(device["max_blocks_per_multiprocessor"])
        max_regs = int(device["max_registers_per_multiprocessor"])
        max_smem = int(device["max_shared_memory_per_multiprocessor"])
        sms = int(device["num_multiprocessors"])
    except (KeyError, TypeError, ValueError):
        return None
    if threads <= 0 or blocks <= 0 or max_warps <= 0 or sms <= 0:
        return None
    warps_per_block = -(-threads // warp)
    limits = [max_warps // warps_per_block, max_blocks]
    if registers_per_thread > 0:
        regs_per_warp = -(-(registers_per_thread * warp) // 256) * 256
        limits.append((max_regs // regs_per_warp) // warps_per_block)
    reserved = device.get("reserved_shared_memory_per_block")
    if reserved is None:  # the driver reserves 1 KiB of shared memory per block from sm_80 on
        reserved = 1024 if _cc_major(device) >= 8 else 0
    if shared_memory_bytes + int(reserved) > 0:
        limits.append(max_smem // (shared_memory_bytes + int(reserved)))
    per_sm = max(min(limits), 0)
    theoretical = per_sm * warps_per_block / max_warps
    fill = min(1.0, blocks / (per_sm * sms)) if per_sm else 0.0
    return round(100.0 * min(theoretical, 1.0) * fill, 2)


def _cc_major(device: Mapping[str, Any]) -> int:
    try:
        return int(str(device.get("compute_capability", "0")).split(".")[0])
    except ValueError:
        return 0


def build_timeline(collector: ActivityCollector, to_ref: Callable[[int], int], *, end_ns: int,
                   dump_graph_node_mapping: bool = False, threads: Mapping[int, tuple[int, str]] | None = None
                   ) -> tuple[list[Track], list[Span], list[Instant], list[Flow], dict[str, Any]]:
    """Tracks, spans, instants and flows from the collected records; times mapped by ``to_ref``.

    ``threads`` maps an OS thread id (as CUPTI reports it) to the Python thread (ident, name), so
    CUDA calls land on the same ``thread:<ident>`` track as other backends' host data; other
    threads get ``thread:os:<tid>``. Returns also facts for the metadata (devices seen, unclosed
    NVTX ranges).
    """
    threads = threads or {}
    # A flow only where both ends were kept (the launch and the GPU work); no dangling ids.
    host_ids = {int(r.get("correlation_id", 0)) for r in collector.records if r["kind"] in API_KINDS}
    both = {int(r.get("correlation_id", 0)) for r in collector.records
            if r["kind"] in ("kernel", "memcpy", "memset", "graph")} & host_ids
    both.discard(0)
    tracks: dict[str, Track] = {}
    spans: list[Span] = []
    instants: list[Instant] = []
    open_ranges: dict[int, tuple[str, str, int, dict[str, Any]]] = {}
    devices = collector.device_info

    def stream_track(dev: int, stream: Any) -> str:
        if stream is None:
            tid = f"device:{dev}"
            tracks.setdefault(tid, Track(tid, f"GPU {dev}", "device", f"GPU {dev}", device=dev))
            return tid
        tid = f"device:{dev}:stream:{int(stream)}"
        tracks.setdefault(tid, Track(tid, f"GPU {dev} stream {int(stream)}", "stream", f"GPU {dev}", device=dev,
                                     stream=int(stream)))
        return tid

    def thread_track(tid: Any) -> str:
        if tid is None:
            key = "thread:unknown"
            tracks.setdefault(key, Track(key, "unknown thread", "thread"))
            return key
        py = threads.get(int(tid))
        if py is not None:
            key = f"thread:{py[0]}"
            tracks.setdefault(key, Track(key, py[1], "thread", tid=int(tid)))
        else:
            key = f"thread:os:{int(tid)}"
            tracks.setdefault(key, Track(key, f"thread {int(tid)}", "thread", tid=int(tid)))
        return key

    for r in collector.records:
        kind = r["kind"]
        if kind in ("kernel", "memcpy", "memset", "graph"):
            dev = int(r.get("device_id", 0))
            start = to_ref(int(r["start"]))
            dur = max(int(r["end"]) - int(r["start"]), 0)
            cid = int(r.get("correlation_id", 0))
            args: dict[str, Any] = {"device": dev, "stream": r.get("stream_id"), "correlation_id": cid}
            if kind == "kernel":
                smem_static = int(r.get("static_shared_memory", 0))
                smem_dyn = int(r.get("dynamic_shared_memory", 0))
                regs = int(r.get("registers_per_thread", 0))
                args.update(grid=list(r.get("grid", [])), block=list(r.get("block", [])), registers_per_thread=regs,
                            static_shared_memory_bytes=smem_static, dynamic_shared_memory_bytes=smem_dyn)
                if dev in devices:
                    occ = occupancy_pct(args["block"], args["grid"], regs, smem_static + smem_dyn, devices[dev])
                    if occ is not None:
                        args["occupancy_pct"] = occ
                name = str(r.get("name", "kernel"))
            elif kind == "memcpy":
                nbytes = int(r.get("bytes", 0))
                ck = MEMCPY_KINDS.get(int(r.get("copy_kind", 0)), "Unknown")
                args.update(bytes=nbytes, kind=ck)
                if dur:
                    args["bandwidth_bytes_per_s"] = nbytes * 1e9 / dur
                name = f"Memcpy {ck}"
            elif kind == "memset":
                nbytes = int(r.get("bytes", 0))
                args.update(bytes=nbytes, value=int(r.get("value", 0)))
                if dur:
                    args["bandwidth_bytes_per_s"] = nbytes * 1e9 / dur
                name = "Memset"
            else:
                args["graph_id"] = int(r.get("graph_id", 0))
                name = f"CUDA graph {args['graph_id']}"
            if dump_graph_node_mapping and r.get("graph_id"):
                args["graph_id"] = int(r["graph_id"])
                if r.get("graph_node_id"):
                    args["graph_node_id"] = int(r["graph_node_id"])
            spans.append(Span(name, stream_track(dev, r.get("stream_id")), start, dur, kind, args,
                              flow_ids=(cid,) if cid in both else ()))
        elif kind == "sync":
            # sync records carry a context, not a device; they go on the stream (or a per-context row)
            stream = r.get("stream_id")
            ctx = int(r.get("context_id", 0))
            typ = SYNC_TYPES.get(int(r.get("type", 0)), "unknown")
            if stream is not None:
                track = f"context:{ctx}:stream:{int(stream)}"
                tracks.setdefault(track, Track(track, f"context {ctx} stream {int(stream)} (sync)", "stream",
                                               stream=int(stream)))
            else:
                track = f"context:{ctx}"
                tracks.setdefault(track, Track(track, f"context {ctx} (sync)", "other"))
            cid = int(r.get("correlation_id", 0))
            spans.append(Span(typ, track, to_ref(int(r["start"])), max(int(r["end"]) - int(r["start"]), 0), "sync",
                              {"type": typ, "context": ctx, "stream": stream, "correlation_id": cid}))
        elif kind in ("runtime", "driver"):
            cid = int(r.get("correlation_id", 0))
            spans.append(Span(str(r.get("name", "")), thread_track(r.get("thread_id")), to_ref(int(r["start"])),
                              max(int(r["end"]) - int(r["start"]), 0), "runtime",
                              {"correlation_id": cid, "cbid": int(r.get("cbid", 0)), "api": kind},
                              flow_ids=(cid,) if cid in both else ()))
        elif kind == "marker":
            flags = int(r.get("flags", 0))
            mid = int(r.get("id", 0))
            t = to_ref(int(r["timestamp"]))
            if flags & MARKER_INSTANTANEOUS:
                instants.append(Instant(str(r.get("name", "")), thread_track(r.get("thread_id")), t, "nvtx",
                                        {"domain": r.get("domain", "")}))
            elif flags & MARKER_START:
                open_ranges[mid] = (str(r.get("name", "")), thread_track(r.get("thread_id")), t,
                                    {"domain": r.get("domain", "")})
            else:
                begun = open_ranges.pop(mid, None)
                if begun is not None:
                    name, track, t0, a = begun
                    spans.append(Span(name, track, t0, max(t - t0, 0), "nvtx", a))
    unclosed = 0
    for name, track, t0, a in open_ranges.values():
        unclosed += 1
        spans.append(Span(name, track, t0, max(end_ns - t0, 0), "nvtx", {**a, "unclosed": True}))
    flows = [Flow(cid, "launch", "cuda") for cid in sorted(both)]
    facts = {"unclosed_nvtx_ranges": unclosed,
             "devices": {str(k): {kk: vv for kk, vv in v.items() if kk != "kind"} for k, v in devices.items()}}
    return list(tracks.values()), spans, instants, flows, facts

