"""``omniprof config show``: the effective configuration as TOML (written by tomli-w)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

__all__ = ["dump_toml"]


def dump_toml(data: Mapping[str, Any]) -> str:
    """Plain data as TOML (tomli-w: scalars before tables). TOML has no null: keys whose value is
    None are left out and named in a comment at the top (``# logdir is not set``).

    >>> print(dump_toml({"backend": ["cpu"], "logdir": None, "backends": {"cpu": {"interval_s": 0.001}}}), end="")
    # logdir is not set
    backend = [
        "cpu",
    ]
    <BLANKLINE>
    [backends.cpu]
    interval_s = 0.001
    """
    import tomli_w

    unset: list[str] = []
    text = tomli_w.dumps(_without_none(data, (), unset))
    return "".join(f"# {key} is not set\n" for key in unset) + text


def _without_none(data: Mapping[str, Any], prefix: tuple[str, ...], unset: list[str]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for k, x in data.items():
        if x is None:
            unset.append(".".join((*prefix, str(k))))
        elif isinstance(x, Mapping):
            out[k] = _without_none(x, (*prefix, str(k)), unset)
        else:
            out[k] = x
    return out
