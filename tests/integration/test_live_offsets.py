"""The committed offset table (omniprof/live/_offsets.py) is what each CPython's own headers say.

benchmarks/live/gen_offsets.py compiles a program against each pyenv python's internal headers and
prints offsetof()/sizeof(); this derives them again for every 3.10-3.12 present and compares.
"""

from __future__ import annotations

import importlib.util
import os

import pytest

from omniprof.live._offsets import OFFSETS

HERE = os.path.dirname(os.path.abspath(__file__))
SCRIPT = os.path.join(HERE, os.pardir, os.pardir, "benchmarks", "live", "gen_offsets.py")


def _gen():
    spec = importlib.util.spec_from_file_location("gen_offsets", SCRIPT)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


GEN = _gen()


@pytest.mark.parametrize("python", GEN.pythons(), ids=os.path.basename)
def test_table_matches_the_headers(python):
    version, derived = GEN.derive(python)
    assert OFFSETS[version] == derived


def test_every_supported_minor_is_in_the_table():
    assert {v[:2] for v in OFFSETS} == {(3, 10), (3, 11), (3, 12), (3, 13)}
    assert len(GEN.pythons()) == 4  # this machine has all three: none of the comparisons above was skipped
