"""``omniprof diff`` as a CI gate on real torch runs: does it tell a 20% slower op from noise?

A small CPU training step (MLP forward/backward + SGD) has one extra op of its own, a matmul
``torch.mm(a, w)`` run under ``record_function("probe")`` so it is easy to name. Runs alternate
between setups (base, other, other, base, ...: the order flips every pair) so that machine load and
position hit both alike; the garbage of the previous run is collected before each. Each run is one
omniprof torch profile (default levels, no device).

* identical: 5 base runs vs 5 runs of the very same setup (the same step function and tensors).
  Target: 0 regressions.
* slower: 5 base runs vs 5 runs where only ``aten::mm`` is made 20% slower (its inner dimension
  is 20% larger, so it does 20% more work; nothing else changes). Target: ``aten::mm`` reported
  (with the ``probe`` range and the table's total if they pass the threshold as a consequence of it), nothing else.

Run: ``python benchmarks/diff_noise.py [--runs 5] [--trials 3]``; ``--trials`` repeats each
experiment with fresh runs and prints every verdict.
"""

from __future__ import annotations

import argparse
import gc
import warnings

import torch
from torch.profiler import record_function

import omniprof
from omniprof.analysis.diff import diff, format_diff

warnings.simplefilter("ignore")
torch.set_num_threads(1)


def make(inner: int, shared: dict):
    """The step; the model, optimizer and data are ``shared`` by every setup, so two setups differ only
    in the probe matmul's operands."""
    if not shared:
        torch.manual_seed(0)
        model = torch.nn.Sequential(torch.nn.Linear(256, 256), torch.nn.ReLU(), torch.nn.Linear(256, 10))
        shared.update(model=model, opt=torch.optim.SGD(model.parameters(), lr=0.01), x=torch.randn(64, 256),
                      y=torch.randint(0, 10, (64,)))
    model, opt, x, y = shared["model"], shared["opt"], shared["x"], shared["y"]
    a, w = torch.randn(256, inner), torch.randn(inner, 256)

    def step() -> None:
        for _ in range(3):
            loss = torch.nn.functional.cross_entropy(model(x), y)
            loss.backward()
            opt.step()
            opt.zero_grad()
            with record_function("probe"):
                torch.mm(a, w)

    return step


def profile(step) -> omniprof.ProfileResult:
    gc.collect()  # the previous run's garbage is not collected on this run's time
    with omniprof.Profiler(backend="torch", options=omniprof.ProfileOptions(device_tracer_level=0)) as prof:
        step()
    return prof.result


def experiment(runs: int, other_inner: int | None) -> tuple[list, list]:
    """``other_inner`` None: the other side is the very same setup (same objects) as the base."""
    shared: dict = {}
    base_step = make(400, shared)
    other_step = base_step if other_inner is None else make(other_inner, shared)
    base_step(), other_step()  # warm up
    base, other = [], []
    for i in range(runs):  # order flipped every pair, so position in the pair hits both sides alike
        if i % 2:
            other.append(profile(other_step))
            base.append(profile(base_step))
        else:
            base.append(profile(base_step))
            other.append(profile(other_step))
    return base, other


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--runs", type=int, default=5)
    ap.add_argument("--trials", type=int, default=3)
    ap.add_argument("--verbose", action="store_true")
    ns = ap.parse_args()
    print(f"torch {torch.__version__}; {ns.runs} vs {ns.runs} runs per trial, {ns.trials} trial(s)")
    for label, inner in (("identical", None), ("aten::mm 20% slower", 480)):
        for trial in range(ns.trials):
            base, other = experiment(ns.runs, inner)
            d = diff(base, other)
            regressed = [f"{r.key} ({r.delta_pct:+.1f}%, conf {r.confidence_pct:.1f}%)" for _, r in d.regressions]
            mm = next(r for t in d.tables if t.name == "op_stats" for r in t.rows if r.key == "aten::mm")
            print(f"{label:22s} trial {trial + 1}: {len(d.regressions)} regression(s): "
                  f"{', '.join(regressed) or '-'}; aten::mm {mm.delta_pct:+.1f}% p={mm.p_value}")
            if ns.verbose:
                print(format_diff(d, max_rows=8))


if __name__ == "__main__":
    main()
