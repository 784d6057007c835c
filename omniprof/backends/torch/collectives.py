"""``torch.distributed`` as the communication layer of ``Profiler(distributed=True)``.

:class:`TorchCollectives` implements :class:`omniprof.core.collectives.Collectives`;
``TorchBackend.job_collectives()`` hands one out when this process is in an initialised process
group. torch is imported only when one is made.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from omniprof.core.collectives import decode_object, encode_object
from omniprof.core.distributed import detect_environment
from omniprof.errors import DistributedError

__all__ = ["TorchCollectives", "GLOO_RELEASE_WAIT_S", "job_running"]


def job_running() -> bool:
    """Whether this process is in an initialised ``torch.distributed`` process group (torch is not
    imported by this check: a program that never imported it has none)."""
    import sys

    tdist = sys.modules.get("torch.distributed")
    return tdist is not None and tdist.is_available() and tdist.is_initialized()


#: After a collective that gloo runs on its worker threads (all-gather, gather), how long the caller
#: waits for the worker to let go of the tensors it was given (normally microseconds). Tensors still
#: held after that stay referenced by this module until the process exits (see :class:`TorchCollectives`).
GLOO_RELEASE_WAIT_S = 2.0
#: Tensors handed to such a collective that a worker thread of the process group may still hold.
_gloo_held: list[Any] = []


def _keep_until_released(tensors: Sequence[Any], wait_s: float = GLOO_RELEASE_WAIT_S) -> None:
    """Drop our references to ``tensors`` only once no gloo worker thread holds them any more.

    ``ProcessGroupGloo`` runs an all-gather or a gather on one of its worker threads, which marks
    the work complete (waking the caller) and only then drops its own references to the work's
    tensors. If the caller has let go of a tensor first, the worker's release is the last one and
    must take the GIL to free the tensor's Python object. When the interpreter starts finalizing
    while the worker waits for the GIL, Python ends that thread with ``pthread_exit``, whose forced
    unwind meets the tensor's ``noexcept`` destructor: ``std::terminate``, "terminate called without
    an active exception", SIGABRT. A rank whose last collective is ours and that exits right after
    (``Profiler.stop()`` then the end of the script) hits that now and then on a loaded machine;
    torch does not guard against it (pytorch/pytorch#190489). Holding a reference until the worker
    has let go (``Tensor._use_count() == 1``) means the worker never frees a Python object: the main
    thread does. Tensors still held after ``wait_s`` (or on a torch without ``_use_count``) are kept
    here until the process exits, which is safe too: the interpreter frees them only once it is
    finalizing, when torch no longer takes the GIL to free them.
    """
    import time

    from omniprof.core.clock import monotonic

    _gloo_held.extend(tensors)
    deadline = monotonic() + wait_s
    while True:
        _gloo_held[:] = [t for t in _gloo_held if getattr(t, "_use_count", lambda: 2)() > 1]
        if not _gloo_held or monotonic() >= deadline:
            return
        time.sleep(0.0002)  # sleep, not spin: on a busy CPU the worker thread needs it to run


class TorchCollectives:
    """:class:`~omniprof.core.collectives.Collectives` over ``torch.distributed`` (an initialised default process group).

    Object collectives and the clock exchange run on a gloo group: the default one when its backend
    includes gloo, else one created here with ``new_group(backend="gloo")`` (every rank must
    construct this object at the same point, as ``Profiler.start()`` does).

    Objects travel as :func:`~omniprof.core.collectives.encode_object` bytes (JSON, as over jax's key-value store; never
    pickle) in uint8 tensors this class creates and holds until gloo's worker thread has let go of
    them (:func:`_keep_until_released`), rather than through ``torch.distributed.all_gather_object``,
    whose internal tensors a worker thread may free as the process exits (a SIGABRT at exit).
    """

    def __init__(self) -> None:
        try:
            import torch.distributed as dist
        except ImportError as e:
            raise DistributedError("distributed=True needs torch.distributed (pip install 'omniprof[torch]'); "
                                   f"it cannot be imported: {e}") from e
        if not dist.is_available() or not dist.is_initialized():
            env = detect_environment()
            where = (f" The environment says this is rank {env.rank} of {env.world_size} ({env.launcher})."
                     if env else "")
            raise DistributedError(
                "distributed=True needs an initialised torch.distributed process group, and there is none." + where +
                " Call torch.distributed.init_process_group(...) (e.g. backend='gloo' or 'nccl', init_method='env://' "
                "under torchrun) before starting the Profiler, or leave distributed=False to profile this process alone")
        self._dist = dist
        self.rank = dist.get_rank()
        self.world_size = dist.get_world_size()
        backend = str(dist.get_backend())
        self.group = None if "gloo" in backend else dist.new_group(backend="gloo")
        self.backend = backend
        self.layer = "torch.distributed"

    def _exchange(self, obj: Any, dst: int | None) -> list[Any] | None:
        """Every rank's ``obj``: on every rank (``dst`` None) or on rank ``dst`` only."""
        import torch

        data = encode_object(obj)
        size = torch.tensor([len(data)], dtype=torch.int64)
        sizes = [torch.zeros(1, dtype=torch.int64) for _ in range(self.world_size)]
        self._dist.all_gather(sizes, size, group=self.group)
        _keep_until_released([size, *sizes])
        lengths = [int(s.item()) for s in sizes]
        padded = torch.zeros(max(lengths), dtype=torch.uint8)
        padded[:len(data)] = torch.frombuffer(bytearray(data), dtype=torch.uint8)
        outs: list[Any] | None = None
        if dst is None or self.rank == dst:
            outs = [torch.empty(max(lengths), dtype=torch.uint8) for _ in range(self.world_size)]
        if dst is None:
            self._dist.all_gather(outs, padded, group=self.group)
        else:
            self._dist.gather(padded, outs, dst=dst, group=self.group)
        _keep_until_released([padded, *(outs or ())])
        if outs is None:
            return None
        return [decode_object(o[:n].numpy().tobytes()) for o, n in zip(outs, lengths)]

    def all_gather_object(self, obj: Any) -> list[Any]:
        out = self._exchange(obj, None)
        assert out is not None  # every rank receives
        return out

    def gather_object(self, obj: Any, dst: int = 0) -> list[Any] | None:
        return self._exchange(obj, dst)

    def send_ints(self, values: Sequence[int], peer: int) -> None:
        import torch

        # gloo's send and recv run on the caller's thread and let go of the tensor before returning.
        self._dist.send(torch.tensor(list(values), dtype=torch.int64), peer, group=self.group)

    def recv_ints(self, count: int, peer: int) -> list[int]:
        import torch

        buf = torch.zeros(count, dtype=torch.int64)
        self._dist.recv(buf, peer, group=self.group)
        return [int(x) for x in buf.tolist()]
