"""The wheels the device machine lacks for benchmarks/gpu_acceptance.py, into a git-ignored folder.

The device image (see the device tool's KINDS.md) has python 3.12, torch 2.11 (cu130), jax 0.11.2
with the CUDA 13 plugin, nvidia-cuda-cupti 13.0, nvidia-ml-py, numpy, protobuf, absl-py, etils,
werkzeug, attrs, rich, setuptools; it reaches no package index. This script downloads what omniprof's
GPU paths need beyond that (``--no-deps``, manylinux x86-64 wheels for CPython 3.12) and writes
``MANIFEST.txt``. omniprof itself is not among them: benchmarks/gpu_acceptance.sh builds it on the
device from the working tree that travels with the command (C extensions compiled there), so the
code that runs is always the code of that moment.

    WHEELS      installed into the run's site folder: cupti-python (matching the image's CUDA 13.0
                CUPTI), xprof and the modules its converter imports that the image lacks, omniprof's
                pure-Python dependencies missing there
    fallback/M/ installed only when the image cannot import module M, or has it older than
                fallback/M/MIN_VERSION (pynvml: nvidia-ml-py; google.protobuf: protobuf 6.31.1)
    build/      only for building omniprof there (setuptools >= 74.1 reads ext-modules from
                pyproject.toml)

Usage: python benchmarks/gpu_wheels.py [--dest .whl] [--check]
``--check`` also proves the folder is enough: it makes a fresh Python 3.12 venv holding only the
image's packages that these wheels import (without nvidia-ml-py and with an old protobuf, so that
both fallbacks are taken), runs benchmarks/gpu_acceptance.sh in it with pip ``--no-index`` (so
nothing comes from the network) up to the acceptance script's "no GPU", then imports every carried
module and runs xprof's converter on an xplane recorded here.
"""

from __future__ import annotations

import argparse
import hashlib
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PLATFORMS = ["manylinux_2_17_x86_64", "manylinux2014_x86_64", "manylinux_2_24_x86_64", "manylinux_2_27_x86_64",
             "manylinux_2_28_x86_64", "manylinux1_x86_64", "any"]

#: what the image lacks, pinned (name, version); KINDS.md's package list is the image's
WHEELS = [
    ("cupti-python", "13.0.1"),     # needs nvidia-cuda-cupti~=13.0 and cuda-bindings~=13.0: both in the image
    ("xprof", "2.24.2"),
    ("gviz-api", "1.10.0"),         # xprof's tool data (gviz DataTables)
    ("cattrs", "24.1.3"),           # omniprof; needs attrs >= 23.1 (the image has attrs)
    ("tomli-w", "1.2.0"),           # omniprof
]
#: module -> (name, version, min_version): installed only where the image cannot import the module, or
#: has it older than min_version (xprof's generated code needs protobuf >= 6.31.1)
FALLBACK = {"pynvml": ("nvidia-ml-py", "13.580.126", ""), "google.protobuf": ("protobuf", "6.31.1", "6.31.1")}
BUILD = [("setuptools", "80.9.0")]
#: the image's packages the carried wheels import, installed from the index into the --check venv
#: (the stand-in for the image); versions as the image's pip list gives them where it does
IMAGE_STANDIN = ["numpy", "attrs", "rich", "typing-extensions", "six", "packaging", "cuda-bindings~=13.0",
                 "cuda-pathfinder", "nvidia-cuda-cupti~=13.0.0",
                 # the fallbacks exercised: no nvidia-ml-py, a protobuf older than xprof's generated code needs
                 "protobuf==5.29.5"]


def download(name: str, version: str, dest: Path) -> None:
    cmd = [sys.executable, "-m", "pip", "download", "-q", "--no-deps", "--only-binary=:all:", "--python-version",
           "3.12", "--implementation", "cp", "--abi", "cp312", "--abi", "abi3", "--abi", "none", "-d", str(dest)]
    for p in PLATFORMS:
        cmd += ["--platform", p]
    subprocess.run([*cmd, f"{name}=={version}"], check=True)


def make(dest: Path) -> list[Path]:
    if dest.exists():
        shutil.rmtree(dest)
    for sub in ("", "fallback", "build"):
        (dest / sub).mkdir(parents=True, exist_ok=True)
    for name, version in WHEELS:
        download(name, version, dest)
    for module, (name, version, min_version) in FALLBACK.items():
        (dest / "fallback" / module).mkdir(parents=True, exist_ok=True)
        download(name, version, dest / "fallback" / module)
        if min_version:
            (dest / "fallback" / module / "MIN_VERSION").write_text(min_version + "\n")
    for name, version in BUILD:
        download(name, version, dest / "build")
    files = sorted(p for p in dest.rglob("*") if p.is_file() and p.name != "MANIFEST.txt")
    total = sum(p.stat().st_size for p in files)
    lines = [f"{p.stat().st_size:>10}  {hashlib.sha256(p.read_bytes()).hexdigest()[:16]}  {p.relative_to(dest)}"
             for p in files]
    lines.append(f"{total:>10}  total ({total / 2**20:.1f} MiB; the device tool carries 64 MiB with the tree)")
    (dest / "MANIFEST.txt").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))
    if total > 56 * 2**20:
        raise SystemExit(f"{dest}: {total / 2**20:.1f} MiB leaves too little of the 64 MiB for the working tree")
    return files


#: run in the stand-in after the wrapper, with the wrapper's site folder first on the path
PROBE = """
import importlib, sys
for m in ("omniprof", "cattrs", "tomli_w", "pynvml", "cupti.cupti", "xprof.convert.raw_to_tool_data",
          "omniprof.backends.cpu._nativesampler", "omniprof.backends.cpu._fastwalk",
          "omniprof.backends.memory._allocsampler"):
    mod = importlib.import_module(m)
    print(f"import {m}: ok ({getattr(mod, '__file__', '?')})")
from omniprof.core.registry import get_registry
print("backends from the installed entry points:", ", ".join(get_registry().names("backend")))
if len(sys.argv) > 1:
    from xprof.convert import raw_to_tool_data
    data, _ = raw_to_tool_data.xspace_to_tool_data([sys.argv[1]], "framework_op_stats", {"use_saved_result": False})
    print(f"xprof framework_op_stats on a CPU xplane: {len(data)} bytes of tool data")
"""


def cpu_xplane(where: Path) -> Path | None:
    """An xplane of a small jax function on this machine's CPU (for the probe's xprof call), if jax is here."""
    code = ("import sys, jax, jax.numpy as jnp; f = jax.jit(lambda a: jnp.tanh(a @ a)); x = jnp.ones((64, 64)); "
            "f(x).block_until_ready(); jax.profiler.start_trace(sys.argv[1]); f(x).block_until_ready(); "
            "jax.profiler.stop_trace()")
    if subprocess.run([sys.executable, "-c", code, str(where)], capture_output=True).returncode != 0:
        return None
    return next(where.rglob("*.xplane.pb"), None)


def check(dest: Path, python: str) -> int:
    """The wrapper run in a stand-in for the image, with pip --no-index over the carried folder."""
    with tempfile.TemporaryDirectory(prefix="omniprof-gpu-wheels-") as d:
        venv, site = Path(d) / "image", Path(d) / "site"
        subprocess.run([python, "-m", "venv", str(venv)], check=True)
        py = str(venv / "bin" / "python")
        print(f"--- stand-in for the image: {python} venv + {' '.join(IMAGE_STANDIN)}", flush=True)
        subprocess.run([py, "-m", "pip", "install", "-q", "--disable-pip-version-check", *IMAGE_STANDIN], check=True)
        env = dict(os.environ, PYTHON=py, GPU_WHEELS=str(dest), GPU_SITE=str(site), OUT=str(Path(d) / "out"))
        env.pop("PYTHONPATH", None)
        print(f"--- bash benchmarks/gpu_acceptance.sh (PYTHON={py}, pip --no-index over {dest})", flush=True)
        rc = subprocess.run(["bash", str(ROOT / "benchmarks" / "gpu_acceptance.sh")], cwd=ROOT, env=env).returncode
        print(f"--- exit status {rc} (3: the acceptance script reached 'no GPU')", flush=True)
        xplane = cpu_xplane(Path(d) / "xplane")
        print(f"--- the carried modules import from {site}", flush=True)
        probe = subprocess.run([py, "-c", PROBE, *([str(xplane)] if xplane else [])], cwd=d,
                               env=dict(env, PYTHONPATH=str(site)))
        return 0 if rc == 3 and probe.returncode == 0 else 1


def python312() -> str:
    """A real Python 3.12 (pyenv's shim fails where 3.12 is not selected), else ``python3.12``."""
    found = sorted(Path.home().glob(".pyenv/versions/3.12*/bin/python3.12"))
    return str(found[-1]) if found else (shutil.which("python3.12") or "python3.12")


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--dest", type=Path, default=ROOT / ".whl", help="the folder (git-ignored; default .whl)")
    p.add_argument("--check", action="store_true", help="then run the wrapper against it in a fresh venv")
    p.add_argument("--python", default=python312(), help="the Python 3.12 for --check (the device's version)")
    ns = p.parse_args(argv)
    make(ns.dest.resolve())
    return check(ns.dest.resolve(), ns.python) if ns.check else 0


if __name__ == "__main__":
    sys.exit(main())
