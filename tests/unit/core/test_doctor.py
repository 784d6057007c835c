"""`omniprof doctor`: the environment, each GPU check with its fix, and every backend's status."""

from __future__ import annotations

import json

import pytest

from omniprof.backends.cupti.diagnostics import PRIVILEGES_HINT, SUBSCRIBER_HINT, gpu_checks
from omniprof.backends.cupti.cupti_adapter import CuptiCallError
from omniprof.cli import main
from omniprof.core.doctor import format_doctor, run_doctor
from omniprof.testing.gpu_fakes import FakeCupti, FakeNvml, use_fake_gpu


def test_doctor_on_this_machine_lists_checks_and_backends(capsys):
    """The real doctor runs here, shows the GPU checks and every registered backend with its status."""
    assert main(["doctor", "--no-frameworks"]) == 0
    out = capsys.readouterr().out
    assert "NVIDIA GPU checks" in out and "Backends" in out
    assert "  cpu: ok" in out
    assert "  cupti: " in out
    if "[FAIL] nvml" in out:  # no driver here: the reason and the fix are printed
        assert "fix: " in out and "cupti: unavailable" in out and "why: " in out


def test_doctor_reports_frameworks(capsys):
    """With frameworks, the environment shows jax devices and the torch build."""
    report = run_doctor()
    env = dict(report.environment)
    assert "jax devices" in env and "cpu" in env["jax devices"] or "unavailable" in env["jax"]
    assert "build" in env["torch"] or "unavailable" in env["torch"]
    assert env["xprof"] and env["nvidia-ml-py"] != "not installed"


def test_doctor_json_is_machine_readable(capsys):
    """--json prints one JSON object with environment, gpu and backends."""
    assert main(["doctor", "--json", "--no-frameworks"]) == 0
    data = json.loads(capsys.readouterr().out)
    assert set(data) == {"environment", "gpu", "backends"}
    assert {b["name"] for b in data["backends"]} >= {"cpu", "cupti"}


@pytest.mark.parametrize("cupti, name, hint", [
    (FakeCupti(subscribe_status=39), "cupti_subscriber", SUBSCRIBER_HINT),
    (FakeCupti(subscribe_status=35), "cupti_subscriber", PRIVILEGES_HINT),
], ids=["subscriber", "privileges"])
def test_doctor_explains_cupti_failures(capsys, cupti, name, hint):
    """With a GPU but CUPTI blocked, doctor marks that check FAIL with the remedy, and cupti unavailable."""
    with use_fake_gpu(nvml=FakeNvml(), cupti=cupti):
        assert main(["doctor", "--no-frameworks"]) == 0
    out = capsys.readouterr().out
    assert "[ok] nvml: NVIDIA driver 580.65.06" in out
    assert "[ok] gpus: 0: NVIDIA A100-SXM4-40GB" in out
    assert f"[FAIL] {name}" in out and hint in out
    assert "cupti: unavailable" in out


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
