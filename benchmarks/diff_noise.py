"""``omniprof diff`` as a CI gate on real torch runs: does it tell a 20% slower op from noise?

A small CPU training step (MLP forward/backward + SGD) has one extra op of its own, a batched
matmul ``torch.bmm(a, w)`` (``aten::bmm``, an op the MLP never runs, so its whole row is the
probe's) under ``record_function("probe")``. Runs alternate
between setups (base, other, other, base, ...: the order flips every pair) so that machine load and
position hit both alike; the garbage of the previous run is collected before each. Each run is one
omniprof torch profile (default levels, no device).

* identical: 5 base runs vs 5 runs of the very same setup (the same step function and tensors).
  Target: 0 regressions.
* slower: 5 base runs vs 5 runs where only ``aten::bmm`` is made 20% slower (its inner dimension
  is 20% larger, so it does 20% more work; nothing else changes). Target: ``aten::bmm`` reported
  (with the ``probe`` range and the table's total if they pass the threshold as a consequence of it), nothing else.
  (Until 2026-11-23 the probe was ``torch.mm``, whose row also holds the MLP backward's 9 ``aten::mm``
  calls: that row grew ~15%, not 20%.)

Each trial's runs are judged twice: by ``diff()`` as it is (each op call's self time capped at 1.1x
the median of the same call over all runs) and with plain per-run sums (``clip_calls=None``), with
the 1-minute load average at the trial's start and end beside the verdicts.

Run: ``python benchmarks/diff_noise.py [--runs 5] [--trials 3]``; ``--trials`` repeats each
experiment with fresh runs and prints every verdict.

``--blocks N`` (e.g. 40) records N blocks of three interleaved runs (base, identical, slower; the
order rotates every block) in one process, then judges every 5-vs-5 trial they hold: the N/5
disjoint ones, and ``--resample`` (default 200) more drawn at random from the N blocks (they share
runs, so they are not independent; they smooth the rate). Every run's load average is kept; the
range is printed beside the rates.
"""

from __future__ import annotations

import argparse
import gc
import os
import random
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
    a, w = torch.randn(1, 256, inner), torch.randn(1, inner, 256)

    def step() -> None:
        for _ in range(3):
            loss = torch.nn.functional.cross_entropy(model(x), y)
            loss.backward()
            opt.step()
            opt.zero_grad()
            with record_function("probe"):
                torch.bmm(a, w)

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


def blocks(n: int, size: int, resample: int) -> None:
    """Record ``n`` blocks (base, identical, slower) and judge every trial of ``size`` blocks."""
    shared: dict = {}
    base_step = make(400, shared)
    slow_step = make(480, shared)
    for _ in range(3):
        base_step(), slow_step()  # warm up
    steps = {"base": base_step, "identical": base_step, "slower": slow_step}
    order = list(steps)
    runs: dict = {name: [] for name in steps}
    loads = []
    for b in range(n):
        for name in order[b % 3:] + order[:b % 3]:
            runs[name].append(profile(steps[name]))
            loads.append(os.getloadavg()[0])
    trials = [list(range(i, i + size)) for i in range(0, n - size + 1, size)]
    disjoint = len(trials)
    rng = random.Random(0)
    trials += [sorted(rng.sample(range(n), size)) for _ in range(resample)]
    print(f"{n} blocks of 3 interleaved runs, load average {min(loads):.1f}-{max(loads):.1f} while recording; "
          f"{disjoint} disjoint + {resample} resampled {size}-vs-{size} trials")
    for method, clip in (("capped", 1.1), ("plain sums", None)):
        tally = {"fp": [0, 0], "hit": [0, 0], "extra": [0, 0]}
        for i, t in enumerate(trials):
            part = 0 if i < disjoint else 1
            base = [runs["base"][b] for b in t]
            same = diff(base, [runs["identical"][b] for b in t], clip_calls=clip)
            slow = diff(base, [runs["slower"][b] for b in t], clip_calls=clip)
            _, found, extra = verdict(slow, "aten::bmm")
            tally["fp"][part] += bool(same.regressions)
            tally["hit"][part] += found
            tally["extra"][part] += extra
        r = resample
        print(f"  {method:10s}: identical with a regression {tally['fp'][0]}/{disjoint} disjoint, {tally['fp'][1]}/{r} "
              f"resampled (target 0); aten::bmm 20% slower found {tally['hit'][0]}/{disjoint}, {tally['hit'][1]}/{r} "
              f"(target all); another op reported {tally['extra'][0]}/{disjoint}, {tally['extra'][1]}/{r}")


def verdict(d, target: str) -> tuple[str, bool, bool]:
    """The regressions as text; whether ``target`` is among them; whether anything else (besides the
    probe range and the table's total) is."""
    regressed = [f"{r.key} ({r.delta_pct:+.1f}%, conf {r.confidence_pct:.1f}%)" for _, r in d.regressions]
    keys = {r.key for _, r in d.regressions}
    return ", ".join(regressed) or "-", target in keys, bool(keys - {target, "probe", "(total)"})


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--runs", type=int, default=5)
    ap.add_argument("--trials", type=int, default=3)
    ap.add_argument("--verbose", action="store_true")
    ap.add_argument("--blocks", type=int, default=0, help="record this many blocks and judge every trial they hold")
    ap.add_argument("--resample", type=int, default=200)
    ns = ap.parse_args()
    if ns.blocks:
        print(f"torch {torch.__version__}; {os.cpu_count()} CPUs")
        blocks(ns.blocks, ns.runs, ns.resample)
        return
    print(f"torch {torch.__version__}; {ns.runs} vs {ns.runs} runs per trial, {ns.trials} trial(s); "
          f"{os.cpu_count()} CPUs")
    tally: dict = {}
    for label, inner in (("identical", None), ("aten::bmm 20% slower", 480)):
        for trial in range(ns.trials):
            load0 = os.getloadavg()[0]
            base, other = experiment(ns.runs, inner)
            load1 = os.getloadavg()[0]
            for method, clip in (("capped", 1.1), ("plain sums", None)):
                d = diff(base, other, clip_calls=clip)
                text, found, extra = verdict(d, "aten::bmm")
                bmm = next(r for t in d.tables if t.name == "op_stats" for r in t.rows if r.key == "aten::bmm")
                t = tally.setdefault((label, method), [0, 0, 0])
                t[0] += 1
                t[1] += found if inner else bool(d.regressions)
                t[2] += extra
                print(f"{label:22s} trial {trial + 1} load {load0:4.1f}-{load1:4.1f} {method:10s}: "
                      f"{len(d.regressions)} regression(s): {text}; aten::bmm {bmm.delta_pct:+.1f}% p={bmm.p_value}")
                if ns.verbose:
                    print(format_diff(d, max_rows=8))
    print("summary (load average printed per trial above):")
    for (label, method), (n, hit, extra) in tally.items():
        what = "with any regression (target 0)" if label == "identical" else "aten::bmm found (target all)"
        print(f"  {label:22s} {method:10s}: {hit}/{n} {what}; {extra}/{n} with another op reported")


if __name__ == "__main__":
    main()
