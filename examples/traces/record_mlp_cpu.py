"""Record ``mlp_cpu.pt.trace.json.gz``: a small CPU Kineto trace used by the docs and tests.

Run: ``python examples/traces/record_mlp_cpu.py`` (needs torch; writes beside this file).
"""

import gzip
import shutil
import tempfile
from pathlib import Path

import torch
from torch.profiler import ProfilerActivity, profile, record_function, schedule

model = torch.nn.Sequential(torch.nn.Linear(64, 128), torch.nn.ReLU(), torch.nn.Linear(128, 10))
opt = torch.optim.SGD(model.parameters(), lr=0.01)
x, y = torch.randn(32, 64), torch.randint(0, 10, (32,))

out = Path(__file__).with_name("mlp_cpu.pt.trace.json.gz")


def save(prof):
    with tempfile.TemporaryDirectory() as tmp:
        plain = Path(tmp) / "trace.json"
        prof.export_chrome_trace(str(plain))
        with open(plain, "rb") as src, gzip.GzipFile(out, "wb", mtime=0) as dst:
            shutil.copyfileobj(src, dst)


with profile(activities=[ProfilerActivity.CPU], schedule=schedule(wait=0, warmup=1, active=2, repeat=1),
             on_trace_ready=save, record_shapes=True, profile_memory=True) as prof:
    for _ in range(4):
        with record_function("forward"):
            loss = torch.nn.functional.cross_entropy(model(x), y)
        with record_function("backward"):
            loss.backward()
        opt.step()
        opt.zero_grad()
        prof.step()
print(out)
