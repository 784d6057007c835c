"""Key positions in TOML text (tomlpos) and the TOML writer of `config show`, checked against tomllib."""

from __future__ import annotations

import math
import sys

from hypothesis import given, settings
from hypothesis import strategies as st

from omniprof.config.show import dump_toml
from omniprof.core.tomlpos import key_lines, split_key

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover
    import tomli as tomllib

text_st = st.text(st.characters(blacklist_categories=("Cs",)), max_size=12)
key_st = st.one_of(st.from_regex(r"[A-Za-z_][A-Za-z0-9_-]{0,8}", fullmatch=True), text_st)
scalar_st = st.one_of(st.booleans(), st.integers(-2**63, 2**63 - 1),
                      st.floats(allow_nan=False), text_st)
value_st = st.recursive(scalar_st, lambda inner: st.lists(inner, max_size=3), max_leaves=6)
table_st = st.recursive(st.dictionaries(key_st, value_st, max_size=4),
                        lambda inner: st.dictionaries(key_st, st.one_of(value_st, inner), max_size=4), max_leaves=12)


def _leaf_paths(d, prefix=()):
    for k, v in d.items():
        if isinstance(v, dict):
            yield from _leaf_paths(v, (*prefix, k))
        else:
            yield (*prefix, k)


def _same(a, b):
    if isinstance(a, float) and isinstance(b, float):
        return a == b or (math.isinf(a) and a == b)
    if isinstance(a, dict):
        return isinstance(b, dict) and a.keys() == b.keys() and all(_same(a[k], b[k]) for k in a)
    if isinstance(a, list):
        return isinstance(b, list) and len(a) == len(b) and all(_same(x, y) for x, y in zip(a, b))
    return a == b and type(a) is type(b)


@settings(max_examples=80, deadline=None)
@given(table_st)
def test_dump_round_trips_and_every_key_line_is_found(data):
    """dump_toml output parses back to the same data, and key_lines puts every key on the line that writes it."""
    text = dump_toml(data)
    assert _same(tomllib.loads(text), data)
    lines = key_lines(text)
    rows = text.split("\n")
    for path in _leaf_paths(data):
        assert path in lines, (path, text)
        row = rows[lines[path] - 1]
        key, sep, _ = row.partition(" = ")
        assert sep and tomllib.loads(key + " = 0") == {path[-1]: 0}, (path, row)  # the row writes this key


def test_split_key_quoted_and_dotted():
    """Dotted keys split on unquoted dots only; quotes and escapes are resolved; junk is None."""
    assert split_key(' a . "b.c" . \'d\' ') == ("a", "b.c", "d")
    assert split_key('"x\\"y"') == ('x"y',)
    assert split_key("a b") is None and split_key("") is None
