"""jax's distributed runtime as the communication layer of ``Profiler(distributed=True)``.

:class:`JaxCollectives` implements :class:`omniprof.core.collectives.Collectives` over the key-value
store of the coordination service that ``jax.distributed.initialize`` started;
``XlaBackend.job_collectives()`` hands one out once it was called. jax is not imported here: a
program that never imported it runs no jax job.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

from omniprof.core.collectives import decode_object, encode_object
from omniprof.errors import DistributedError

__all__ = ["JaxCollectives", "JAX_TIMEOUT_S", "JAX_CHUNK_BYTES", "job_running"]


def job_running() -> bool:
    """Whether ``jax.distributed.initialize`` was called in this process (jax is not imported)."""
    import sys

    jax = sys.modules.get("jax")
    return jax is not None and jax.distributed.is_initialized()


#: how long a rank waits for the others in one coordination step over jax's key-value store.
JAX_TIMEOUT_S = 600
#: payloads over jax's key-value store go in pieces of at most this many bytes.
JAX_CHUNK_BYTES = 4 << 20
_jax_instances = 0


class JaxCollectives:
    """:class:`~omniprof.core.collectives.Collectives` over the key-value store of jax's distributed runtime: the coordination
    service ``jax.distributed.initialize`` started (on the coordinator, rank 0's process). No device
    computation runs, so nothing of the coordination lands in a trace, and no CPU collectives
    implementation is needed for it.

    Keys live under ``omniprof/<n>/`` (``n`` counts the instances made in this process; every rank
    makes its instances in the same order, as ``Profiler.start()`` does) and are deleted once read.
    A rank that does not arrive within :data:`JAX_TIMEOUT_S` fails the waiting ranks with a
    :class:`~omniprof.errors.DistributedError` naming it.
    """

    def __init__(self, timeout_s: float = JAX_TIMEOUT_S) -> None:
        global _jax_instances
        import sys

        jax = sys.modules.get("jax")
        if jax is None or not jax.distributed.is_initialized():
            raise DistributedError("distributed=True over jax needs jax.distributed.initialize(...) called first")
        # The rank and the job's size through jax's public API. The coordination service's key-value
        # client has no public spelling (multihost_utils reaches it the same way), so it alone is
        # taken from jax's runtime, and a jax whose runtime moved it gets a DistributedError.
        self.rank, self.world_size = int(jax.process_index()), int(jax.process_count())
        try:
            from jax._src import distributed as jd

            client = jd.global_state.client
        except (ImportError, AttributeError) as e:  # a jax whose runtime moved: say what is missing
            raise DistributedError(f"this jax ({getattr(jax, '__version__', '?')}) does not expose its distributed "
                                   f"runtime's key-value store (jax._src.distributed.global_state.client): {e}") from e
        if client is None:
            raise DistributedError("jax.distributed is initialised but has no coordination client")
        self._client = client
        self._timeout_ms = int(timeout_s * 1000)
        self._prefix = f"omniprof/{_jax_instances}"
        _jax_instances += 1
        self._seq = 0
        self._sent: dict[int, int] = {}
        self._received: dict[int, int] = {}
        self.backend = self.layer = "jax.distributed"

    def _call(self, what: str, peer: int | None, fn: Callable[..., Any], *args: Any) -> Any:
        try:
            return fn(*args)
        except Exception as e:  # jax raises its runtime errors (DEADLINE_EXCEPTED, UNAVAILABLE) as one type
            who = "" if peer is None else f" {'to' if what == 'sending' else 'for'} rank {peer}"
            raise DistributedError(
                f"rank {self.rank}: {what}{who} over jax's key-value store failed: {type(e).__name__}: "
                f"{str(e).strip().splitlines()[0] if str(e).strip() else ''}. Every rank must start, step and stop "
                f"its Profiler alike; a rank that died or lags more than {self._timeout_ms // 1000} s leaves the "
                f"others here") from e

    def _put(self, key: str, data: bytes) -> None:
        chunks = [data[i:i + JAX_CHUNK_BYTES] for i in range(0, len(data), JAX_CHUNK_BYTES)] or [b""]
        for i, c in enumerate(chunks):
            self._call("sending", None, self._client.key_value_set_bytes, f"{key}/{i}", c)
        self._call("sending", None, self._client.key_value_set, f"{key}/n", str(len(chunks)))

    def _get(self, key: str, peer: int) -> bytes:
        n = int(self._call("waiting", peer, self._client.blocking_key_value_get, f"{key}/n", self._timeout_ms))
        return b"".join(self._call("waiting", peer, self._client.blocking_key_value_get_bytes, f"{key}/{i}",
                                   self._timeout_ms) for i in range(n))

    def _exchange(self, obj: Any, readers: Sequence[int]) -> list[Any] | None:
        self._seq += 1
        base = f"{self._prefix}/{self._seq}"
        self._put(f"{base}/{self.rank}", encode_object(obj))
        if self.rank not in readers:
            return None
        out = [decode_object(self._get(f"{base}/{r}", r)) for r in range(self.world_size)]
        # The last reader removes the exchange's keys (the coordinator keeps them otherwise).
        if self._call("counting", None, self._client.key_value_increment, f"{base}/read", 1) == len(readers):
            self._call("cleaning up", None, self._client.key_value_delete, base)
        return out

    def all_gather_object(self, obj: Any) -> list[Any]:
        out = self._exchange(obj, range(self.world_size))
        assert out is not None  # every rank reads
        return out

    def gather_object(self, obj: Any, dst: int = 0) -> list[Any] | None:
        return self._exchange(obj, (dst,))

    def send_ints(self, values: Sequence[int], peer: int) -> None:
        n = self._sent.get(peer, 0)
        self._sent[peer] = n + 1
        self._call("sending", peer, self._client.key_value_set, f"{self._prefix}/p2p/{self.rank}-{peer}/{n}",
                   ",".join(str(int(v)) for v in values))

    def recv_ints(self, count: int, peer: int) -> list[int]:
        n = self._received.get(peer, 0)
        self._received[peer] = n + 1
        key = f"{self._prefix}/p2p/{peer}-{self.rank}/{n}"
        raw = self._call("waiting", peer, self._client.blocking_key_value_get, key, self._timeout_ms)
        self._call("cleaning up", None, self._client.key_value_delete, key)
        values = [int(x) for x in raw.split(",")]
        if len(values) != count:
            raise DistributedError(f"rank {self.rank}: expected {count} integers from rank {peer}, got {len(values)}")
        return values
