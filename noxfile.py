"""Run the cpu and memory backends' tests under every CPython this machine has (pyenv 3.10-3.13).

    python -m pip install nox   # into a venv of your own
    nox                         # every version found
    nox -s cpu-3.12             # one
    nox -s memory-3.13

Each session builds omniprof (with its C extensions, for that interpreter) into a fresh venv and
runs that backend's tests. CI runs the C extensions' checks per version inside the normal pytest
run instead (tests/integration/test_cpu_native.py::test_engine_on_every_cpython,
tests/integration/test_memory_native.py), which needs no venvs.
"""

from __future__ import annotations

import glob
import os

import nox

VERSIONS = ["3.10", "3.11", "3.12", "3.13"]
CPU_TESTS = ["tests/unit/backends/test_cpu_sampler.py", "tests/integration/test_cpu_backend.py",
             "tests/integration/test_cpu_native.py"]
MEMORY_TESTS = ["tests/unit/backends/test_memory.py", "tests/integration/test_memory_native.py"]


# pyenv's interpreters, found by nox as pythonX.Y once their bin directories are on PATH
_BINS = [sorted(glob.glob(os.path.expanduser(f"~/.pyenv/versions/{v}.*/bin")))[-1:] for v in VERSIONS]
os.environ["PATH"] = os.pathsep.join([b for found in _BINS for b in found] + [os.environ.get("PATH", "")])


@nox.session(name="cpu", python=VERSIONS)
def cpu(session: nox.Session) -> None:
    session.install("-e", ".", "pytest>=8", "pytest-timeout>=2.2", "hypothesis>=6.100", "pyinstrument>=4.6",
                    "py-spy>=0.3.14")
    session.run("python", "-c", "from omniprof.backends.cpu.native import native_available as a; print(a())")
    session.run("python", "-m", "pytest", "-q", "-p", "no:cacheprovider", "--no-header", *CPU_TESTS,
                *session.posargs)


@nox.session(name="memory", python=VERSIONS)
def memory(session: nox.Session) -> None:
    session.install("-e", ".", "pytest>=8", "pytest-timeout>=2.2", "hypothesis>=6.100", "jsonschema>=4.20",
                    "perfetto>=0.59", "viztracer>=1.1.1,<1.2")
    session.run("python", "-c", "from omniprof.backends.memory.backend import native_available as a; print(a())")
    session.run("python", "-m", "pytest", "-q", "-p", "no:cacheprovider", "--no-header", *MEMORY_TESTS,
                *session.posargs)
