"""Shared pieces of the xla backend tests: a jitted workload and synthetic GPU xspaces."""

from __future__ import annotations

from pathlib import Path

GPU_XSPACE = '''
planes {{
  id: 2
  name: "/host:CPU"
  lines {{ id: 1 name: "python" timestamp_ns: 1000
    events {{ metadata_id: 1 offset_ps: 4000000 duration_ps: 500000 stats {{ metadata_id: 1 uint64_value: 42 }} }}
  }}
  event_metadata {{ key: 1 value {{ id: 1 name: "cuLaunchKernel" }} }}
  stat_metadata {{ key: 1 value {{ id: 1 name: "correlation_id" }} }}
}}
planes {{
  id: 1
  name: "/device:GPU:0"
  lines {{ id: 1 display_id: 1 name: "Stream #7(Compute)" timestamp_ns: 1000
    events {{ metadata_id: 1 offset_ps: 5000000 duration_ps: 2500000
      stats {{ metadata_id: 1 str_value: "regs:32 static_shared:2048 dynamic_shared:0 grid:1,1,1 block:64,1,1 occ_pct:100.0" }}
      stats {{ metadata_id: 2 uint64_value: 42 }} }}
    events {{ metadata_id: 1 offset_ps: 9000000 duration_ps: 1500000
      stats {{ metadata_id: 1 str_value: "regs:32 static_shared:2048 dynamic_shared:0 grid:1,1,1 block:64,1,1 occ_pct:100.0" }}
      stats {{ metadata_id: 2 uint64_value: 43 }} }}
  }}
  event_metadata {{ key: 1 value {{ id: 1 name: "{kernel}" }} }}
  stat_metadata {{ key: 1 value {{ id: 1 name: "kernel_details" }} }}
  stat_metadata {{ key: 2 value {{ id: 2 name: "correlation_id" }} }}
}}
'''


def write_gpu_xplane(path: Path, kernel: str = "gemm_fusion_dot_1") -> Path:
    """A GPU trace (one stream, two launches of ``kernel``) serialised by jaxlib from XSpace text."""
    from omniprof.formats.xprof_runtime import import_profiler_bindings

    _, pd = import_profiler_bindings()
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(pd.ProfileData.text_proto_to_serialized_xspace(GPU_XSPACE.format(kernel=kernel)))
    return path


def workload():
    """A jitted function (matmul + tanh + add) and its arguments, compiled once."""
    import jax
    import jax.numpy as jnp

    f = jax.jit(lambda x, y: jnp.tanh(x @ y) + 1.0)
    x = jnp.ones((64, 64), jnp.float32)
    f(x, x).block_until_ready()
    return f, x
