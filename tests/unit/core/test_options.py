"""ProfileOptions: every option of the JAX doc, valid values accepted, invalid ones rejected clearly."""

from __future__ import annotations

import pytest

from omniprof import InvalidArgumentError, ProfileOptions
from omniprof.core.options import ADVANCED_KEYS, build_options, parse_cli_value

DOC_KEYS = {
    "tpu_trace_mode", "tpu_num_sparse_cores_to_trace", "tpu_num_sparse_core_tiles_to_trace",
    "tpu_num_chips_to_profile_per_task", "gpu_max_callback_api_events", "gpu_max_activity_api_events",
    "gpu_max_annotation_strings", "gpu_enable_nvtx_tracking", "gpu_enable_cupti_activity_graph_trace",
    "gpu_pm_sample_counters", "gpu_pm_sample_interval_us", "gpu_pm_sample_buffer_size_per_gpu_mb",
    "gpu_num_chips_to_profile_per_task", "gpu_dump_graph_node_mapping",
}


def test_every_documented_advanced_key_is_known():
    """The table covers exactly the TPU and GPU keys of the JAX profiling doc."""
    assert set(ADVANCED_KEYS) == DOC_KEYS


def test_defaults_match_the_jax_doc():
    """Levels default to 2/1/0 and advanced keys to their documented defaults."""
    o = ProfileOptions()
    assert (o.host_tracer_level, o.device_tracer_level, o.python_tracer_level) == (2, 1, 0)
    assert o.advanced("tpu_trace_mode") == "TRACE_ONLY_XLA"
    assert o.advanced("gpu_max_callback_api_events") == 2 * 1024 * 1024
    assert o.advanced("gpu_max_activity_api_events") == 2 * 1024 * 1024
    assert o.advanced("gpu_max_annotation_strings") == 1024 * 1024
    assert o.advanced("gpu_enable_nvtx_tracking") is False
    assert o.advanced("gpu_pm_sample_interval_us") == 500
    assert o.advanced("gpu_pm_sample_buffer_size_per_gpu_mb") == 64
    assert o.advanced("gpu_num_chips_to_profile_per_task") == 0


@pytest.mark.parametrize("field,values", [
    ("host_tracer_level", [0, 1, 2, 3]), ("device_tracer_level", [0, 1]), ("python_tracer_level", [0, 1])])
def test_levels_accept_documented_values(field, values):
    """Each documented level value is accepted, on construction and on assignment."""
    for val in values:
        assert getattr(ProfileOptions(**{field: val}), field) == val
        o = ProfileOptions()
        setattr(o, field, val)
        assert getattr(o, field) == val


@pytest.mark.parametrize("field,bad,allowed", [
    ("host_tracer_level", 7, "0, 1, 2, 3"), ("host_tracer_level", -1, "0, 1, 2, 3"),
    ("host_tracer_level", "2", "0, 1, 2, 3"), ("host_tracer_level", True, "0, 1, 2, 3"),
    ("device_tracer_level", 2, "0, 1"), ("device_tracer_level", 1.0, "0, 1"),
    ("python_tracer_level", 5, "0, 1"), ("python_tracer_level", None, "0, 1"),
])
def test_levels_reject_bad_values_with_message(field, bad, allowed):
    """Bad levels raise InvalidArgumentError naming the field, the allowed values and the bad value."""
    expected = f"'{field}' must be one of {allowed} (got {bad!r})"
    with pytest.raises(InvalidArgumentError) as e:
        ProfileOptions(**{field: bad})
    assert str(e.value) == expected
    o = ProfileOptions()
    with pytest.raises(InvalidArgumentError, match="must be one of"):
        setattr(o, field, bad)
    assert getattr(o, field) == getattr(ProfileOptions(), field)


def test_invalid_argument_error_is_value_error():
    """InvalidArgumentError is a ValueError, so generic handlers still catch it."""
    with pytest.raises(ValueError):
        ProfileOptions(host_tracer_level=9)


VALID = {
    "tpu_trace_mode": ["TRACE_ONLY_HOST", "TRACE_ONLY_XLA", "TRACE_COMPUTE", "TRACE_COMPUTE_AND_SYNC"],
    "tpu_num_sparse_cores_to_trace": [0, 2, 16],
    "tpu_num_sparse_core_tiles_to_trace": [0, 1, 8],
    "tpu_num_chips_to_profile_per_task": [0, 4],
    "gpu_max_callback_api_events": [1, 2 * 1024 * 1024, 2**31 - 1],
    "gpu_max_activity_api_events": [1, 4_000_000],
    "gpu_max_annotation_strings": [1, 1024 * 1024],
    "gpu_enable_nvtx_tracking": [True, False],
    "gpu_enable_cupti_activity_graph_trace": [True, False],
    "gpu_pm_sample_counters": ["", "sm__cycles_active.avg.pct_of_peak_sustained_elapsed",
                               "sm__cycles_active.avg, dram__throughput.avg.pct_of_peak_sustained_elapsed"],
    "gpu_pm_sample_interval_us": [1, 500, 100_000],
    "gpu_pm_sample_buffer_size_per_gpu_mb": [1, 64, 4096],
    "gpu_num_chips_to_profile_per_task": [0, 1, 8],
    "gpu_dump_graph_node_mapping": [True, False],
}

INVALID = {
    "tpu_trace_mode": [("TRACE_ONLY_HOSTS", "must be one of TRACE_ONLY_HOST"), ("trace_only_host", "must be one of"),
                       (1, "must be one of")],
    "tpu_num_sparse_cores_to_trace": [(-1, "between 0 and"), ("2", "must be an integer"), (2.0, "must be an integer")],
    "tpu_num_sparse_core_tiles_to_trace": [(-5, "between 0 and"), (None, "must be an integer")],
    "tpu_num_chips_to_profile_per_task": [(-1, "between 0 and"), (True, "must be an integer")],
    "gpu_max_callback_api_events": [(0, "between 1 and"), (2**31, "between 1 and"), ("many", "must be an integer")],
    "gpu_max_activity_api_events": [(-1, "between 1 and"), (1.5, "must be an integer")],
    "gpu_max_annotation_strings": [(0, "between 1 and")],
    "gpu_enable_nvtx_tracking": [(1, "must be a bool"), ("true", "must be a bool")],
    "gpu_enable_cupti_activity_graph_trace": [(0, "must be a bool")],
    "gpu_pm_sample_counters": [(5, "comma-separated string"), ("a,,b", "bad name ''"), ("sm cycles", "bad name")],
    "gpu_pm_sample_interval_us": [(0, "between 1 and"), (-500, "between 1 and")],
    "gpu_pm_sample_buffer_size_per_gpu_mb": [(4097, "between 1 and 4096"), (0, "between 1 and 4096"),
                                             (8192, "(got 8192)")],
    "gpu_num_chips_to_profile_per_task": [(-1, "between 0 and"), ("all", "must be an integer")],
    "gpu_dump_graph_node_mapping": [("yes", "must be a bool")],
}


def test_matrix_covers_every_key():
    """The valid and invalid matrices below cover every advanced key."""
    assert set(VALID) == set(ADVANCED_KEYS) == set(INVALID)


@pytest.mark.parametrize("key,value", [(k, v) for k, vs in VALID.items() for v in vs])
def test_advanced_valid_values_accepted(key, value):
    """A documented value is accepted and read back (metric lists without the spaces around commas)."""
    o = ProfileOptions(advanced_configuration={key: value})
    expected = STORED_AS.get(value, value) if isinstance(value, str) else value
    assert o.advanced_configuration[key] == expected
    assert o.advanced(key) == expected


#: Values stored differently from how they were given: the runtime splits metric lists on commas
#: and would look for ' dram__...' with the space.
STORED_AS = {"sm__cycles_active.avg, dram__throughput.avg.pct_of_peak_sustained_elapsed":
             "sm__cycles_active.avg,dram__throughput.avg.pct_of_peak_sustained_elapsed"}


@pytest.mark.parametrize("key,value,fragment", [(k, v, f) for k, vs in INVALID.items() for v, f in vs])
def test_advanced_invalid_values_rejected(key, value, fragment):
    """A bad value raises naming the key, the value and what is allowed."""
    with pytest.raises(InvalidArgumentError) as e:
        ProfileOptions(advanced_configuration={key: value})
    msg = str(e.value)
    assert f"advanced_configuration[{key!r}]" in msg
    assert fragment in msg
    assert repr(value) in msg


def test_unknown_advanced_key_names_nearest():
    """An unknown key names itself, its value, the nearest valid key and the valid keys."""
    with pytest.raises(InvalidArgumentError) as e:
        ProfileOptions(advanced_configuration={"gpu_max_activity_events": 5})
    msg = str(e.value)
    assert "'gpu_max_activity_events'" in msg
    assert "did you mean 'gpu_max_activity_api_events'?" in msg
    assert "(got value 5)" in msg
    assert "tpu_trace_mode" in msg


def test_enum_typo_suggests_value():
    """A misspelt enum value suggests the nearest allowed one."""
    with pytest.raises(InvalidArgumentError, match="did you mean 'TRACE_COMPUTE'"):
        ProfileOptions(advanced_configuration={"tpu_trace_mode": "TRACE_COMPUTES"})


def test_jax_doc_example_assignment_validates():
    """The doc's `options.advanced_configuration = {...}` form works and is validated."""
    o = ProfileOptions()
    o.advanced_configuration = {"tpu_trace_mode": "TRACE_ONLY_HOST", "tpu_num_sparse_cores_to_trace": 2}
    assert o.advanced("tpu_num_sparse_cores_to_trace") == 2
    with pytest.raises(InvalidArgumentError):
        o.advanced_configuration = {"tpu_trace_mode": "NOPE"}
    assert o.advanced("tpu_trace_mode") == "TRACE_ONLY_HOST"


def test_advanced_configuration_is_read_only():
    """Item assignment cannot bypass validation."""
    o = ProfileOptions(advanced_configuration={"gpu_enable_nvtx_tracking": True})
    with pytest.raises(TypeError):
        o.advanced_configuration["gpu_enable_nvtx_tracking"] = "garbage"  # type: ignore[index]


def test_advanced_configuration_must_be_mapping():
    """A non-mapping advanced_configuration is rejected."""
    with pytest.raises(InvalidArgumentError, match="must be a mapping"):
        ProfileOptions(advanced_configuration=[("tpu_trace_mode", "TRACE_ONLY_HOST")])


def test_from_dict_unknown_top_level_key():
    """from_dict rejects an unknown field and names the nearest one."""
    with pytest.raises(InvalidArgumentError, match="did you mean 'host_tracer_level'"):
        ProfileOptions.from_dict({"host_tracer_levl": 1})


def test_round_trip_dict():
    """to_dict/from_dict round-trip, and equality compares advanced contents."""
    o = ProfileOptions(host_tracer_level=3, advanced_configuration={"gpu_pm_sample_interval_us": 250})
    assert ProfileOptions.from_dict(o.to_dict()) == o


def test_build_options_for_backend_options_class():
    """build_options validates a per-backend class and names the owner and nearest key."""
    from omniprof.backends.cpu import CpuOptions

    assert build_options(CpuOptions, {"interval_s": 0.002}, owner="backend 'cpu'").interval_s == 0.002
    with pytest.raises(InvalidArgumentError, match=r"backend 'cpu'.*did you mean 'interval_s'"):
        build_options(CpuOptions, {"interval": 0.002}, owner="backend 'cpu'")
    with pytest.raises(InvalidArgumentError, match=r"'interval_s' must be > 0.0 \(got -1.0\)"):
        build_options(CpuOptions, {"interval_s": -1.0}, owner="backend 'cpu'")


@pytest.mark.parametrize("text,value", [("2", 2), ("true", True), ("0.5", 0.5), ('"x"', "x"), ("TRACE_ONLY_HOST",
                                                                                              "TRACE_ONLY_HOST")])
def test_parse_cli_value(text, value):
    """-O values parse as JSON, falling back to the raw string."""
    assert parse_cli_value(text) == value


def test_a_name_sharing_two_letters_is_not_suggested():
    """``-b nosuch`` named no backend, yet was told "did you mean 'torch'?" (they share 'o' and
    'ch'); a real typo still gets its suggestion."""
    from omniprof.core.validators import nearest

    backends = ["cpu", "cupti", "memory", "rusage", "torch", "xla"]
    assert nearest("nosuch", backends) is None
    assert nearest("troch", backends) == "torch"
    assert nearest("memroy", backends) == "memory"
