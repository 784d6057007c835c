"""What a distributed session needs of a job's communication layer, and how objects travel on it.

:class:`Collectives` is the interface; the adapters live with their frameworks' backends
(``omniprof.backends.torch.collectives``: ``torch.distributed``; ``omniprof.backends.xla.collectives``:
jax's distributed runtime), and a backend class hands its own out through
``Backend.job_collectives()`` when its framework runs a job in this process. Objects travel as
:func:`encode_object` bytes (JSON, never pickle: a peer's bytes are data, not code).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Protocol

from omniprof.errors import InvalidArgumentError

__all__ = ["Collectives", "encode_object", "decode_object"]


class Collectives(Protocol):
    """What the coordination needs from a job's communication layer.

    Attributes:
        rank, world_size: this process's place in the job.
        layer: the layer's name (``"torch.distributed"``, ``"jax.distributed"``).
        backend: what carries it (the process group's backend, such as ``"gloo"``, or the layer).
    """

    rank: int
    world_size: int
    layer: str
    backend: str

    def all_gather_object(self, obj: Any) -> list[Any]: ...

    def gather_object(self, obj: Any, dst: int = 0) -> list[Any] | None: ...

    def send_ints(self, values: Sequence[int], peer: int) -> None: ...

    def recv_ints(self, count: int, peer: int) -> list[int]: ...


_BYTES_KEY, _ITEMS_KEY = "__omniprof_bytes__", "__omniprof_items__"


def _to_json(obj: Any) -> Any:
    if isinstance(obj, (bytes, bytearray)):
        import base64

        return {_BYTES_KEY: base64.b64encode(obj).decode("ascii")}
    if isinstance(obj, dict):
        if all(isinstance(k, str) for k in obj) and not {_BYTES_KEY, _ITEMS_KEY} & set(obj):
            return {k: _to_json(v) for k, v in obj.items()}
        return {_ITEMS_KEY: [[_to_json(k), _to_json(v)] for k, v in obj.items()]}
    if isinstance(obj, (list, tuple)):
        return [_to_json(v) for v in obj]
    if obj is None or isinstance(obj, (str, int, float, bool)):
        return obj
    raise InvalidArgumentError(f"cannot send a {type(obj).__name__} between ranks (JSON data, bytes and "
                               f"dicts with any keys only)")


def _from_json(obj: Any) -> Any:
    if isinstance(obj, dict):
        if set(obj) == {_BYTES_KEY}:
            import base64

            return base64.b64decode(obj[_BYTES_KEY])
        if set(obj) == {_ITEMS_KEY}:
            return {_hashable(_from_json(k)): _from_json(v) for k, v in obj[_ITEMS_KEY]}
        return {k: _from_json(v) for k, v in obj.items()}
    if isinstance(obj, list):
        return [_from_json(v) for v in obj]
    return obj


def _hashable(key: Any) -> Any:
    return tuple(_hashable(k) for k in key) if isinstance(key, list) else key


def encode_object(obj: Any) -> bytes:
    """What the ranks exchange, as JSON (never pickle: a peer's bytes are data, not code). Bytes
    travel as base64, dicts with non-string keys as key/value pairs; tuples come back as lists.

    >>> decode_object(encode_object({"a": (1, None), 3: b"\\x00\\xff"}))
    {'a': [1, None], 3: b'\\x00\\xff'}
    """
    import json

    return json.dumps(_to_json(obj), separators=(",", ":")).encode()


def decode_object(data: bytes) -> Any:
    """The inverse of :func:`encode_object`."""
    import json

    return _from_json(json.loads(data))
