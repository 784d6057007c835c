"""The memory backend's C extension (_allocsampler) on every CPython this machine has (3.10-3.13).

Its instance reader (``instance_state``, which the heap snapshot uses instead of ``__dict__``)
follows each version's private object layout: 3.10 a dict slot, 3.11 a values pointer and a dict
pointer before the object, 3.12 one tagged pointer for either, 3.13 values inline after the object.
Each is built here with that interpreter's own headers and checked under it by
tests/tools/allocsampler_check.py against independent truths.
"""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

from tests.tools import build_extension, cpython_interpreters

ROOT = Path(__file__).resolve().parents[2]
CHECKS = 24  # every check allocsampler_check.py makes on 3.11+ (21 on 3.10: no values array there)


@pytest.mark.slow
@pytest.mark.parametrize("version,exe", cpython_interpreters(), ids=[v for v, _ in cpython_interpreters()])
def test_allocsampler_on_every_cpython(version, exe, tmp_path):
    """Built without a warning, then: attribute values read for 10,000 instances are the very
    objects getattr gives; reading them builds no dict and leaves nothing (objects counted by type
    with gc before and after; on 3.11+ no instance refers to a dict); after ``__dict__`` was asked
    for, that dict is returned, with a new key, a deleted and a changed attribute read right;
    __slots__, 40 attributes (beyond the shared keys), a variable-size int subclass and a function's
    dict; the values array's bytes plus sys.getsizeof equal what tracemalloc saw allocated per
    instance; and the sampler at rate 1 records 100 buffers at their line, innermost frame first,
    freed or alive as they are, with their type and thread."""
    build_extension(exe, ROOT / "omniprof/backends/memory/_allocsampler.c", tmp_path)
    run = subprocess.run([exe, str(ROOT / "tests/tools/allocsampler_check.py"), str(tmp_path)],
                         capture_output=True, text=True, timeout=180)
    assert run.returncode == 0, f"{version}:\n{run.stdout}\n{run.stderr[-3000:]}"
    assert "FAIL" not in run.stdout
    assert run.stdout.count("OK ") == (CHECKS - 3 if version == "3.10" else CHECKS), run.stdout
