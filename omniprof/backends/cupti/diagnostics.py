"""Why GPU profiling can or cannot run here, and how to fix it.

:func:`gpu_checks` runs each step a ``cupti`` session needs -- nvidia-ml-py importable, NVML
loads (NVIDIA driver present), at least one GPU, cupti-python importable, the CUDA driver and
libcupti load, and CUPTI accepts a subscriber (no other CUPTI tool attached, enough privileges)
-- and explains each failure with its remedy. :meth:`CuptiBackend.probe` raises the first failure;
``omniprof doctor`` shows them all.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import attrs

from omniprof.backends.cupti.cupti_adapter import (
    ERROR_INSUFFICIENT_PRIVILEGES,
    ERROR_INVALID_OPERATION,
    ERROR_MULTIPLE_SUBSCRIBERS,
    ERROR_VIRTUALIZED_INSUFFICIENT_PRIVILEGES,
    CuptiCallError,
    CuptiLoadError,
)
from omniprof.backends.cupti.nvml import (
    NVML_ERROR_DRIVER_NOT_LOADED,
    NVML_ERROR_LIBRARY_NOT_FOUND,
    NVML_ERROR_NO_PERMISSION,
    NvmlCallError,
)
from omniprof.errors import BackendUnavailableError

__all__ = ["Check", "gpu_checks", "explain_nvml", "explain_cupti", "raise_first_failure", "PRIVILEGES_HINT",
           "LD_LIBRARY_PATH_HINT", "SUBSCRIBER_HINT", "NVPERF_HINT",
           "NVML_ONLY_HINT"]

PRIVILEGES_HINT = (
    "Allow profiling by non-admin users and reboot: "
    "echo 'options nvidia \"NVreg_RestrictProfilingToAdminUsers=0\"' "
    "| sudo tee -a /etc/modprobe.d/nvidia-kernel-common.conf "
    "&& sudo update-initramfs -u && sudo reboot (or run as root; see "
    "https://developer.nvidia.com/nvidia-development-tools-solutions-err-nvgpuctrperm-cupti)")
LD_LIBRARY_PATH_HINT = (
    "Add the directory holding libcupti.so to LD_LIBRARY_PATH, e.g. "
    "export LD_LIBRARY_PATH=/usr/local/cuda/extras/CUPTI/lib64:$LD_LIBRARY_PATH (find it with `locate libcupti.so`), "
    "or install the CUPTI wheel: pip install nvidia-cuda-cupti")
SUBSCRIBER_HINT = (
    "CUPTI allows one subscriber per process: stop the other profiler first (torch.profiler/Kineto, jax.profiler, "
    "Nsight Systems, DCGM profiling), and don't combine backend 'cupti' with 'torch' or 'xla' on a GPU in one run")
NVPERF_HINT = (
    "Add the directory holding libnvperf_host.so and libnvperf_target.so (they ship beside libcupti.so) to "
    "LD_LIBRARY_PATH, e.g. export LD_LIBRARY_PATH=/usr/local/cuda/extras/CUPTI/lib64:$LD_LIBRARY_PATH, or leave "
    "gpu_pm_sample_counters empty")
#: CUptiResult -> (what cannot be traced, how to get a setup that can), for the device/setup codes
DEVICE_HINTS = {
    33: ("on this virtual GPU (vGPU)", "Enable profiling for the vGPU in the hypervisor (NVIDIA vGPU docs: "
                                       "'enable_profiling'), or profile on a bare-metal or passthrough GPU"),
    38: ("while the legacy CUDA profiler is active", "Unset CUDA_PROFILE / COMPUTE_PROFILE and stop nvprof"),
    41: ("with confidential computing on", "Turn confidential computing (CC) mode off for the GPU to profile it"),
    42: ("on a CMP (crypto-mining) GPU", "Profile on a GPU with profiling support; CMP boards have none"),
    43: ("on this MIG instance", "Profile a GPU not split into MIG instances, or update to a driver and CUPTI that "
                                 "trace MIG (NVML metrics still work: device_tracer_level=0)"),
    44: ("on a GPU in an SLI group", "Disable SLI for the GPU to profile it"),
    45: ("under WSL with this driver", "Update the Windows NVIDIA driver to one that supports CUPTI under WSL, or "
                                       "profile on Linux"),
    47: ("hardware event system tracing under MPS", "Stop the MPS control daemon (echo quit | nvidia-cuda-mps-control) "
                                                    "or profile without MPS"),
}
NVML_ONLY_HINT = ". For NVML metrics without CUPTI, set the cupti option record_activity=false"
INSTALL_HINT = ("pip install 'omniprof[gpu]' (nvidia-ml-py provides the pynvml module; the separate 'pynvml' "
                "package is a deprecated shim) ")


@attrs.frozen
class Check:
    """One diagnostic step: ``name``, whether it passed, what was found (``detail``), and the fix."""

    name: str
    ok: bool
    detail: str
    hint: str = ""


def explain_nvml(e: BaseException) -> tuple[str, str]:
    """(reason, hint) for an NVML failure."""
    code = getattr(e, "code", None)
    if code == NVML_ERROR_LIBRARY_NOT_FOUND:
        return ("no NVIDIA driver: the NVML library libnvidia-ml.so.1 was not found",
                "Install the NVIDIA driver on a machine with an NVIDIA GPU (it provides libnvidia-ml.so.1); "
                "in a container, start it with the NVIDIA Container Toolkit (docker run --gpus all)")
    if code == NVML_ERROR_DRIVER_NOT_LOADED:
        return ("the NVIDIA kernel driver is not loaded (NVML_ERROR_DRIVER_NOT_LOADED)",
                "Load it (sudo modprobe nvidia) or reboot after installing the driver; `nvidia-smi` must work")
    if code == NVML_ERROR_NO_PERMISSION:
        return ("no permission to open the NVIDIA devices (NVML_ERROR_NO_PERMISSION)",
                "Give your user access to /dev/nvidia* (the group that owns them), or run with --gpus in a container")
    return (f"NVML failed: {e}", "Check that `nvidia-smi` works for this user")


def explain_cupti(e: BaseException) -> tuple[str, str]:
    """(reason, hint) for a CUPTI failure."""
    if isinstance(e, CuptiLoadError):
        if e.missing == "module":
            return (f"cupti-python is not installed ({e.detail})", INSTALL_HINT)
        if e.missing == "driver":
            return (f"the CUDA driver library libcuda.so.1 could not be loaded ({e.detail})",
                    "Install the NVIDIA driver (it provides libcuda.so.1)")
        if e.missing == "nvperf":
            return (f"the nvperf libraries PM sampling needs (libnvperf_host.so, libnvperf_target.so) could not be "
                    f"loaded ({e.detail})", NVPERF_HINT)
        return (f"the CUPTI library libcupti.so could not be loaded ({e.detail})", LD_LIBRARY_PATH_HINT)
    status = getattr(e, "status", None)
    if status in DEVICE_HINTS:
        what, hint = DEVICE_HINTS[status]
        return (f"CUPTI cannot trace {what} ({getattr(e, 'name', status)})", hint)
    if status in (ERROR_INSUFFICIENT_PRIVILEGES, ERROR_VIRTUALIZED_INSUFFICIENT_PRIVILEGES):
        return ("CUPTI_ERROR_INSUFFICIENT_PRIVILEGES: the NVIDIA driver restricts GPU profiling to admin users",
                PRIVILEGES_HINT)
    if status == ERROR_INVALID_OPERATION and "PmSampling" in str(getattr(e, "call", "")):
        return ("PM sampling is already enabled on this GPU by another tool in this process",
                "Stop the other PM sampling session (another profiler, or a second 'cupti' backend) first, or leave "
                "gpu_pm_sample_counters empty")
    if status == ERROR_MULTIPLE_SUBSCRIBERS:
        return ("another CUPTI subscriber is already attached to this process "
                "(CUPTI_ERROR_MULTIPLE_SUBSCRIBERS_NOT_SUPPORTED)", SUBSCRIBER_HINT)
    return (f"CUPTI failed: {e}", "Check the CUDA driver and CUPTI versions match (CUPTI 13 needs a CUDA 13 driver)")


def gpu_checks(nvml_factory: Callable[[], Any], cupti_factory: Callable[[], Any], *,
               stop_at_first: bool = False, check_cupti: bool = True) -> list[Check]:
    """Run every GPU check in order; later checks that depend on a failed one are not run."""
    checks: list[Check] = []

    def add(c: Check) -> bool:
        checks.append(c)
        return c.ok or not stop_at_first

    try:
        nvml = nvml_factory()
    except ImportError as e:  # pragma: no cover - nvidia-ml-py is a declared extra
        add(Check("nvml", False, f"nvidia-ml-py is not installed ({e})", INSTALL_HINT))
        return checks
    try:
        nvml.init()
    except ImportError as e:
        add(Check("nvml", False, f"nvidia-ml-py is not installed ({e})", INSTALL_HINT))
        return checks
    except NvmlCallError as e:
        reason, hint = explain_nvml(e)
        add(Check("nvml", False, reason, hint))
        return checks
    try:
        versions = nvml.versions()
        count = nvml.device_count()
        names = []
        for i in range(count):
            d = nvml.device(i)
            names.append(f"{i}: {d.get('name', '?')}")
    except NvmlCallError as e:
        reason, hint = explain_nvml(e)
        _shutdown(nvml)
        add(Check("nvml", False, reason, hint))
        return checks
    _shutdown(nvml)
    if not add(Check("nvml", True, f"NVIDIA driver {versions.get('driver', '?')}")):
        return checks
    if count == 0:
        add(Check("gpus", False, "NVML found no NVIDIA GPU",
                  "Check `nvidia-smi`; in a container, start it with --gpus all"))
        return checks
    if not add(Check("gpus", True, "; ".join(names))) or not check_cupti:
        return checks
    cupti = cupti_factory()
    try:
        cupti.load()
    except (CuptiLoadError, CuptiCallError) as e:
        reason, hint = explain_cupti(e)
        add(Check("cupti", False, reason, hint))
        return checks
    if not add(Check("cupti", True, "libcupti loaded" + "".join(f", {k} {v}" for k, v in cupti.versions().items()))):
        return checks
    try:
        cupti.subscribe()
        cupti.unsubscribe()
    except CuptiCallError as e:
        reason, hint = explain_cupti(e)
        add(Check("cupti_subscriber", False, reason, hint))
        return checks
    add(Check("cupti_subscriber", True, "CUPTI accepted a subscriber (no other CUPTI tool attached)"))
    return checks


def _shutdown(nvml: Any) -> None:
    try:
        nvml.shutdown()
    except NvmlCallError:
        pass


def cupti_library_path() -> str | None:
    """The libcupti.so that cupti-python uses when it comes from the nvidia-cuda-cupti wheel, if found."""
    import glob
    import importlib.util

    spec = importlib.util.find_spec("nvidia")
    for base in (spec.submodule_search_locations or []) if spec else []:
        found = sorted(glob.glob(f"{base}/*/lib/libcupti.so*"))
        if found:
            return found[0]
    return None


def nvtx_injection_hint() -> str:
    path = cupti_library_path() or "/usr/local/cuda/extras/CUPTI/lib64/libcupti.so"
    return (f"set NVTX_INJECTION64_PATH={path} (the libcupti cupti-python uses) in the environment before the "
            f"process starts, so NVTX hands its ranges to CUPTI")


def raise_first_failure(checks: list[Check], plugin: str = "cupti") -> None:
    for c in checks:
        if not c.ok:
            raise BackendUnavailableError(c.detail, c.hint, plugin=plugin)


#: compute capability from which PM sampling's GPU_TIME_INTERVAL trigger works (GA10x; not GA100 or Turing)
PM_TIME_TRIGGER_MIN_CC = (8, 6)


def compute_capability(text: Any) -> tuple[int, int]:
    """``"8.6"`` -> (8, 6); (0, 0) when unknown."""
    try:
        major, minor = str(text).split(".")[:2]
        return int(major), int(minor)
    except ValueError:
        return (0, 0)


def pm_trigger_unsupported(devices: list[Any]) -> str:
    """Why PM sampling cannot run on some of ``devices`` (NVML device facts), or "" when it can.

    A GPU whose compute capability NVML did not report is given the benefit of the doubt (CUPTI
    itself refuses it, with its own words, if need be).
    """
    old = [f"GPU {d.get('index', i)} {d.get('name', '?')} (compute capability {d['compute_capability']})"
           for i, d in enumerate(devices)
           if (0, 0) < compute_capability(d.get("compute_capability")) < PM_TIME_TRIGGER_MIN_CC]
    if not old:
        return ""
    return (f"{'; '.join(old)}: PM sampling's GPU time-interval trigger (gpu_pm_sample_interval_us) needs compute "
            f"capability 8.6 or newer (GA10x, Ada, Hopper, Blackwell; not Turing or GA100)")


def gpu_capabilities(nvml_factory: Callable[[], Any], cupti_factory: Callable[[], Any]) -> list[Any]:
    """What the ``cupti`` backend can do here, feature by feature (``omniprof doctor``)."""
    import os

    from omniprof.plugin import Capability

    checks = {c.name: c for c in gpu_checks(nvml_factory, cupti_factory)}
    failed = next((c for c in checks.values() if not c.ok), None)
    why = f"the {failed.name!r} GPU check failed: {failed.detail}" if failed is not None else ""
    nvml_ok = checks.get("nvml") is not None and checks["nvml"].ok and checks.get("gpus") is not None \
        and checks["gpus"].ok
    caps = [Capability("NVML device metrics (utilisation, memory, power, clocks, temperature, PCIe)", nvml_ok,
                       checks["gpus"].detail if nvml_ok else why)]
    cupti_ok = nvml_ok and all(checks.get(k) is not None and checks[k].ok for k in ("cupti", "cupti_subscriber"))
    caps.append(Capability("CUPTI activity (kernels, memcpy/memset, sync, CUDA API calls, CUDA graphs)", cupti_ok,
                           checks["cupti"].detail if cupti_ok else why))
    if not cupti_ok:
        caps.append(Capability("PM sampling (gpu_pm_sample_counters)", False, why))
        caps.append(Capability("NVTX ranges (gpu_enable_nvtx_tracking)", False, why))
        return caps
    devices = []
    nvml = nvml_factory()
    try:
        nvml.init()
        devices = [nvml.device(i) for i in range(nvml.device_count())]
    except NvmlCallError:
        pass
    finally:
        _shutdown(nvml)
    why_not = pm_trigger_unsupported(devices)
    if why_not:
        caps.append(Capability("PM sampling (gpu_pm_sample_counters)", False, why_not))
    else:
        detail = "GPU time-interval trigger supported on every GPU"
        if hasattr(os, "geteuid") and os.geteuid() != 0:
            detail += ("; as a non-root user it also needs GPU performance-counter access "
                       "(NVreg_RestrictProfilingToAdminUsers=0)")
        caps.append(Capability("PM sampling (gpu_pm_sample_counters)", True, detail))
    injected = os.environ.get("NVTX_INJECTION64_PATH")
    caps.append(Capability("NVTX ranges (gpu_enable_nvtx_tracking)", bool(injected),
                           f"NVTX_INJECTION64_PATH={injected}" if injected else nvtx_injection_hint()))
    return caps
