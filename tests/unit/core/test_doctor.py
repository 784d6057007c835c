"""`omniprof doctor`: the environment, each GPU check with its fix, and every backend's status."""

from __future__ import annotations

import json

import pytest

from omniprof.backends.cupti.cupti_adapter import CuptiCallError
from omniprof.backends.cupti.diagnostics import (
    PRIVILEGES_HINT,
    SUBSCRIBER_HINT,
    gpu_checks,
)
from omniprof.cli import main
from omniprof.core.doctor import format_doctor, run_doctor
from omniprof.testing.gpu_fakes import H100_DEVICE, FakeCupti, FakeNvml, fake_cupti_backend
from tests.tools import nvml_loads


def test_doctor_on_this_machine_lists_checks_and_backends(capsys):
    """The real doctor runs here, shows the GPU checks and every registered backend with its status."""
    assert main(["doctor", "--no-frameworks"]) == 0
    out = capsys.readouterr().out
    assert "NVIDIA GPU checks" in out and "Backends" in out
    assert "  cpu: ok" in out
    assert "  cupti: " in out
    if nvml_loads():  # a driver: the NVML check passes
        assert "[ok] nvml" in out
    else:  # no driver: the check fails with the reason and the fix, and cupti says why it is unavailable
        assert "[FAIL] nvml" in out and "fix: " in out and "cupti: unavailable" in out and "why: " in out


def test_doctor_reports_frameworks(capsys):
    """With frameworks, the environment shows the jax and torch that are installed here, with jax's
    devices and torch's build (references: the packages' own metadata and jax.devices())."""
    import importlib.metadata as md

    import jax

    report = run_doctor()
    env = dict(report.environment)
    assert env["jax"].startswith(md.version("jax") + ", jaxlib " + md.version("jaxlib"))
    assert env["jax devices"] == ", ".join(f"{d.platform}:{d.id} ({d.device_kind})" for d in jax.devices())
    assert env["torch"].startswith(md.version("torch").split("+")[0]) and " build)" in env["torch"]
    assert env["xprof"] == md.version("xprof")
    assert env["nvidia-ml-py"] == md.version("nvidia-ml-py")


def test_doctor_json_is_machine_readable(capsys):
    """--json prints one JSON object with environment, gpu and backends."""
    assert main(["doctor", "--json", "--no-frameworks"]) == 0
    data = json.loads(capsys.readouterr().out)
    assert set(data) == {"environment", "gpu", "backends", "capabilities"}
    assert {b["name"] for b in data["backends"]} >= {"cpu", "cupti"}


@pytest.mark.parametrize("status, name, hint", [
    (39, "cupti_subscriber", SUBSCRIBER_HINT),
    (35, "cupti_subscriber", PRIVILEGES_HINT),
], ids=["subscriber", "privileges"])
def test_doctor_explains_cupti_failures(capsys, tmp_path, monkeypatch, status, name, hint):
    """With a GPU but CUPTI blocked, doctor marks that check FAIL with the remedy, and cupti unavailable.
    The fake GPU reaches the CLI as a user would put it there: a ``cupti`` plugin named in --plugins."""
    (tmp_path / f"fakegpu{status}.py").write_text(  # a module name per case: sys.modules keeps the first
        "from omniprof.backends.cupti import CuptiBackend\n"
        "from omniprof.testing.gpu_fakes import FakeCupti, FakeNvml, fake_adapters\n\n"
        "class BlockedGpu(CuptiBackend):\n"
        f"    adapters = fake_adapters(FakeNvml(), FakeCupti(subscribe_status={status}))\n", encoding="utf-8")
    (tmp_path / "plugins.toml").write_text(f'[backend.cupti]\ntarget = "fakegpu{status}:BlockedGpu"\noverride = true\n',
                                           encoding="utf-8")
    monkeypatch.syspath_prepend(str(tmp_path))
    assert main(["doctor", "--plugins", str(tmp_path / "plugins.toml")]) == 0
    out = capsys.readouterr().out
    assert "[ok] nvml: NVIDIA driver 580.65.06" in out
    assert "[ok] gpus: 0: NVIDIA A100-SXM4-40GB" in out
    assert f"[FAIL] {name}" in out and hint in out
    # the backend still runs (NVML metrics); what it cannot do here is listed under it
    assert "  cupti: ok" in out and "    [yes] NVML device metrics" in out
    assert "    [no ] CUPTI activity (kernels, memcpy/memset, sync, CUDA API calls, CUDA graphs): the " \
           f"'{name}' GPU check failed" in out


def test_gpu_checks_all_pass_on_a_working_gpu():
    """Every check passes on a working (fake) GPU, in the documented order."""
    checks = gpu_checks(FakeNvml, FakeCupti)
    assert [(c.name, c.ok) for c in checks] == [("nvml", True), ("gpus", True), ("cupti", True),
                                               ("cupti_subscriber", True)]
    text = format_doctor(type(run_doctor(frameworks=False))(environment=(), gpu=tuple(checks), backends=()))
    assert "FAIL" not in text


def test_cupti_call_error_names_the_result_code():
    """A CUPTI error message names the CUptiResult and the call."""
    e = CuptiCallError(35, "activity_enable")
    assert str(e) == "activity_enable failed with CUPTI_ERROR_INSUFFICIENT_PRIVILEGES (35)"




def _caps(nvml, cupti):
    return {c.feature.split(" (")[0]: c for c in fake_cupti_backend(nvml, cupti).capabilities()}


def test_cupti_capabilities_follow_the_gpu_and_its_compute_capability(monkeypatch):
    """On an H100 everything is available; on an A100 (8.0) PM sampling's time trigger is not, and says why."""
    monkeypatch.setenv("NVTX_INJECTION64_PATH", "/opt/cuda/libcupti.so")
    h100 = _caps(FakeNvml(devices=[H100_DEVICE]), FakeCupti())
    assert all(c.available for c in h100.values()), h100
    assert "H100" in h100["NVML device metrics"].detail
    assert h100["NVTX ranges"].detail == "NVTX_INJECTION64_PATH=/opt/cuda/libcupti.so"
    a100 = _caps(FakeNvml(), FakeCupti())
    assert a100["NVML device metrics"].available and a100["CUPTI activity"].available
    pm = a100["PM sampling"]
    assert not pm.available and "compute capability 8.0" in pm.detail and "8.6 or newer" in pm.detail
    monkeypatch.delenv("NVTX_INJECTION64_PATH")
    nvtx = _caps(FakeNvml(devices=[H100_DEVICE]), FakeCupti())["NVTX ranges"]
    assert not nvtx.available and "NVTX_INJECTION64_PATH=" in nvtx.detail


def test_cupti_capabilities_name_the_check_that_failed():
    """No driver: nothing is available, each row naming the failed check; CUPTI blocked: NVML still is."""
    none = _caps(FakeNvml(init_error=12), FakeCupti())
    assert not any(c.available for c in none.values())
    assert all("'nvml' GPU check failed: no NVIDIA driver" in c.detail for c in none.values())
    blocked = _caps(FakeNvml(), FakeCupti(subscribe_status=39))
    assert blocked["NVML device metrics"].available
    assert not blocked["CUPTI activity"].available and "another CUPTI subscriber" in blocked["CUPTI activity"].detail


def test_framework_capabilities_say_what_this_machine_lacks():
    """torch and xla report device tracing as this machine allows it, with what to install."""
    from omniprof.backends.torch.backend import TorchBackend
    from omniprof.backends.xla.backend import XlaBackend

    torch = pytest.importorskip("torch")
    caps = {c.feature.split(" (")[0]: c for c in TorchBackend.capabilities()}
    assert caps["CPU operators"].available and torch.__version__ in caps["CPU operators"].detail
    assert caps["GPU kernels, memcpy and memory"].available == torch.cuda.is_available()
    if not torch.version.cuda and not torch.cuda.is_available():
        assert "CPU-only torch build" in caps["GPU kernels, memcpy and memory"].detail
    jax = pytest.importorskip("jax")
    xcaps = {c.feature.split(" (")[0]: c for c in XlaBackend.capabilities()}
    accel = [d for d in jax.devices() if d.platform != "cpu"]
    assert xcaps["device tracing"].available == bool(accel)
    if not accel:
        assert "jax sees only the CPU" in xcaps["device tracing"].detail


@pytest.mark.parametrize("scope, euid, ok, words", [
    ("0", 1000, True, "ptrace_scope=0"), ("1", 1000, True, "PR_SET_PTRACER"),
    ("2", 1000, False, "only admins (CAP_SYS_PTRACE)"), ("3", 1000, False, "forbids ptrace"),
    ("2", 0, True, "running as root"), (None, 1000, True, "no Yama"),
])
def test_py_spy_capability_reads_the_ptrace_scope(tmp_path, scope, euid, ok, words):
    """Whether py-spy may attach follows root and kernel.yama.ptrace_scope."""
    from omniprof.backends.cpu.pyspy import ptrace_allowed

    f = tmp_path / "ptrace_scope"
    if scope is not None:
        f.write_text(scope + "\n")
    allowed, why = ptrace_allowed(str(f), euid=euid)
    assert allowed is ok and words in why


def test_doctor_lists_capabilities_and_survives_a_plugin_whose_capabilities_raise(capsys, monkeypatch):
    """Capability rows appear under each backend; a capabilities() that raises is a row, not a crash."""
    from omniprof.backends.memory.backend import MemoryBackend

    def boom(cls):
        raise RuntimeError("capability probe exploded")

    monkeypatch.setattr(MemoryBackend, "capabilities", classmethod(boom))
    report = run_doctor()
    caps = dict(report.capabilities)
    assert caps["memory"][0].feature == "capabilities()" and "exploded" in caps["memory"][0].detail
    assert any(c.feature.startswith("signal engine") and c.available for c in caps["cpu"])
    text = format_doctor(report)
    assert "    [no ] capabilities(): raised RuntimeError: capability probe exploded" in text
    assert "    [yes] thread engine" in text
    assert "thread engine" in [c["feature"] for c in json.loads(json.dumps(report.to_dict()))["capabilities"]["cpu"]]


def test_doctor_rows_come_one_by_one_the_first_before_any_backend_is_asked():
    """The report is produced row by row: the first row (omniprof's version) comes before any backend
    is loaded or probed, each slow probe is announced before the rows it gives, and the rows are those
    of the collected report (the reference: run_doctor in the same process)."""
    from omniprof import __version__
    from omniprof.core.doctor import doctor_rows

    events = []
    for kind, row in doctor_rows(frameworks=False, on_probe=lambda what: events.append(("probe", what))):
        events.append((kind, row))
    assert events[0] == ("environment", ("omniprof", __version__))
    first_probe = next(i for i, e in enumerate(events) if e[0] == "probe")
    assert [e[1][0] for e in events[:first_probe]] == ["omniprof", "python", "platform"]
    report = run_doctor(frameworks=False)
    assert [e[1] for e in events if e[0] == "environment"] == list(report.environment)
    assert [e[1][0] for e in events if e[0] == "backend"] == list(report.backends)
    probed = [e[1] for e in events if e[0] == "probe"]
    assert {f"{b.name}: environment" for b in report.backends if b.status in ("ok", "unavailable")} <= set(probed)


def test_doctor_prints_as_it_goes_what_format_doctor_formats(capsys):
    """`omniprof doctor` prints line by line exactly the report format_doctor gives for the same data."""
    assert main(["doctor", "--no-frameworks"]) == 0
    out = capsys.readouterr().out
    assert out.rstrip("\n") == format_doctor(run_doctor(frameworks=False))


def test_core_doctor_imports_no_framework():
    """omniprof.core.doctor imports neither jax nor torch: framework facts come from the backends'
    environment() (issue 26). Read from the source, every import statement at any depth."""
    import ast
    from pathlib import Path

    import omniprof.core.doctor

    found = []
    for path in [Path(omniprof.core.doctor.__file__)]:
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            names = ([a.name for a in node.names] if isinstance(node, ast.Import)
                     else [node.module or ""] if isinstance(node, ast.ImportFrom) else [])
            found += [f"{path.name}: {n}" for n in names if n.split(".")[0] in ("jax", "jaxlib", "torch")]
    assert found == []


def test_framework_facts_come_from_their_backends():
    """jax's facts come from the xla backend, torch's from the torch backend (without importing either
    when frameworks=False: the installed versions, as importlib.metadata reads them)."""
    import importlib.metadata as md

    from omniprof.backends.torch.backend import TorchBackend
    from omniprof.backends.xla.backend import XlaBackend

    assert dict(XlaBackend.environment(frameworks=False))["jax"] == md.version("jax")
    assert dict(TorchBackend.environment(frameworks=False)) == {"torch": md.version("torch")}
