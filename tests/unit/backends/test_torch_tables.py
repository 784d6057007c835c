"""The torch backend's tables and summaries against torch's own ``key_averages()`` on real CPU runs."""

from __future__ import annotations

import json

import pytest

import omniprof

torch = pytest.importorskip("torch")

LEVEL3 = {"host_tracer_level": 3, "device_tracer_level": 0}


def _transformer_work():
    """A transformer layer's forward/backward/Adam step plus scalar multiplies: ``aten::mul`` with a
    Python scalar re-dispatches to ``aten::mul`` (both carry FLOPs), the case a per-span sum counts twice."""
    torch.manual_seed(0)
    layer = torch.nn.TransformerEncoderLayer(64, 4, 128, batch_first=True)
    opt = torch.optim.Adam(layer.parameters())
    x = torch.randn(2, 10, 64)
    a = torch.randn(16, 32)

    def work():
        y = layer(x)
        (y * 2).sum().backward()
        opt.step()
        a.mul(2)
        a.add(a, alpha=2)

    return work


def test_flops_summary_matches_torch_key_averages():
    """Total FLOPs equal torch's sum over key_averages(): re-dispatched ops are counted once."""
    work = _transformer_work()
    work()  # Adam's state exists from here on: both profiled calls run the same ops
    from torch.profiler import profile

    with profile(with_flops=True, record_shapes=True) as tp:
        work()
    expected = sum(e.flops for e in tp.key_averages())
    with omniprof.Profiler(backend="torch", options=omniprof.ProfileOptions(**LEVEL3)) as prof:
        work()
    part = prof.result.part("torch")
    per_span = sum(s.args.get("flops", 0) for s in part.spans if s.category == "cpu_op")
    assert per_span > expected > 0  # the trace has a re-dispatched op with FLOPs: the case under test
    assert part.summaries["flops"]["total_flops"] == expected
    ops = part.table("op_stats")
    fi = ops.columns.index("flops")
    assert sum(r[fi] or 0 for r in ops.rows) == expected


def test_window_ending_inside_the_loop_is_built_off_the_loop(tmp_path):
    """A schedule window that ends in step(): the step only stops torch's profiler; the Kineto JSON is
    saved, read and published when the result is asked for (or at stop()), with the same content."""
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.ReLU(), torch.nn.Linear(32, 4))
    x = torch.randn(8, 16)
    published = []
    prof = omniprof.Profiler(backend="torch", options=omniprof.ProfileOptions(device_tracer_level=0),
                             schedule=omniprof.schedule(wait=1, warmup=1, active=2, repeat=1), logdir=tmp_path,
                             on_result=published.append)
    prof.start()
    for i in range(6):
        model(x).sum().backward()
        prof.step()
        if i == 3:  # the window (steps 2-3) ended in this step() call
            assert published == []  # nothing built inside the loop ...
            assert list(tmp_path.rglob("*.pt.trace.json")) == []  # ... not even torch's JSON saved
            assert list(tmp_path.rglob("omniprof.result.json")) == []
    result = prof.result  # asked for: built now
    assert published == [result]
    assert len(list(tmp_path.rglob("omniprof.result.json"))) == 1
    steps = [s.args["step_num"] for s in result.part("torch").spans if s.category == "step"]
    assert steps == [2, 3]
    addmm = next(r for r in result.part("torch").table("op_stats").records() if r["name"] == "aten::addmm")
    assert addmm["calls"] == 4  # 2 recorded steps x 2 Linear layers
    assert prof.stop() is result and prof.results == [result]


def test_group_by_input_shape_matches_torch(tmp_path):
    """op_table(group_by_input_shape=True) on torch's own exported trace equals torch's
    key_averages(group_by_input_shape=True): one row per (name, input shapes), same calls, times, memory."""
    from torch.profiler import ProfilerActivity, profile, record_function

    from omniprof.analysis.torch_ops import op_table
    from omniprof.readers import KinetoReader

    read_trace = KinetoReader().read

    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.ReLU(), torch.nn.Linear(32, 4))
    with profile(activities=[ProfilerActivity.CPU], profile_memory=True, record_shapes=True) as p:
        for batch in (8, 8, 24):  # two input shapes for the same ops
            with record_function("step"):
                model(torch.randn(batch, 16)).sum().backward()
    trace = tmp_path / "t.pt.trace.json"
    p.export_chrome_trace(str(trace))
    theirs = {(e.key, str(e.input_shapes)): e for e in p.key_averages(group_by_input_shape=True)}
    part = read_trace(trace).parts[0]
    table = op_table(part, group_by_input_shape=True)
    assert table.name == "op_stats_by_input_shape"
    ours = {(r["name"], str(json.loads(r["input_shapes"]))): r for r in table.records()}
    assert set(ours) == set(theirs)
    addmm = [k for k in ours if k[0] == "aten::addmm"]
    assert len(addmm) == 4  # 2 layers x 2 batch sizes
    for key, e in theirs.items():
        row = ours[key]
        assert row["calls"] == e.count, key
        assert abs(row["total_ns"] / 1000 - e.cpu_time_total) <= 2, key   # torch keeps microseconds
        assert abs(row["self_ns"] / 1000 - e.self_cpu_time_total) <= 2, key
        assert row["cpu_memory_self_bytes"] == e.self_cpu_memory_usage, key
    plain = op_table(part)  # without grouping: the part's own op table
    assert plain.rows == part.table("op_stats").rows


def test_memory_timeline_by_category_against_ground_truth():
    """With memory, shapes and stacks recorded, the part holds torch's memory timeline by category; its
    gradient and optimizer-state peaks equal the bytes of the model's parameters and of Adam's state,
    counted from the tensors themselves."""
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(64, 128), torch.nn.ReLU(), torch.nn.Linear(128, 10))
    opt = torch.optim.Adam(model.parameters())
    x = torch.randn(32, 64)
    opts = omniprof.ProfileOptions(host_tracer_level=3, python_tracer_level=1, device_tracer_level=0)
    with omniprof.Profiler(backend="torch", options=opts) as prof:
        for _ in range(2):
            model(x).sum().backward()
            opt.step()
            opt.zero_grad()
    part = prof.result.part("torch")
    param_bytes = sum(p.numel() * p.element_size() for p in model.parameters())
    state_bytes = sum(t.numel() * t.element_size() for s in opt.state.values() for t in s.values()
                      if isinstance(t, torch.Tensor))
    peaks = part.summaries["memory_by_category"]
    assert peaks["peak_gradient_cpu_bytes"] == param_bytes
    assert peaks["peak_optimizer_state_cpu_bytes"] == state_bytes
    series = {c.name: c for c in part.counters}
    grad = series["memory gradient (cpu)"]
    assert grad.unit == "bytes" and max(grad.values) == param_bytes
    # on the part's own clock: inside the recorded ops' time range
    ops = [s for s in part.spans if s.category == "cpu_op"]
    assert min(s.start_ns for s in ops) - 1_000_000 <= grad.t_ns[0] <= max(s.end_ns for s in ops)


def _stack_run(tmp_path):
    """A real torch CPU run with Python stacks (torch 2.x writes and keeps them only with verbose=True),
    exported; and the same trace with the ``Call stack`` args removed (torch's default trace form)."""
    from torch.profiler import ProfilerActivity, profile, record_function

    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.ReLU(), torch.nn.Linear(32, 4))
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    config = torch._C._profiler._ExperimentalConfig(verbose=True)
    with profile(activities=[ProfilerActivity.CPU], with_stack=True, record_shapes=True, profile_memory=True,
                 experimental_config=config) as p:
        for batch in (8, 8, 24):
            with record_function("step"):
                model(torch.randn(batch, 16)).sum().backward()
                opt.step()
    written = tmp_path / "stacks.pt.trace.json"
    p.export_chrome_trace(str(written))
    data = json.loads(written.read_text())
    assert sum("Call stack" in (e.get("args") or {}) for e in data["traceEvents"]) > 100
    for e in data["traceEvents"]:
        (e.get("args") or {}).pop("Call stack", None)
    rebuilt = tmp_path / "nostacks.pt.trace.json"
    rebuilt.write_text(json.dumps(data))
    return p, written, rebuilt


def _assert_same_as_torch(ours, theirs, other_threads=frozenset()):
    """Same keys, calls, CPU times; memory too, except for rows of threads other than the workload's
    (``other_threads``: torch charges an event with every allocation made during it on any thread, we
    with those of its own thread; a pytest helper thread's Python frames differ by that alone)."""
    assert set(ours) == set(theirs), (sorted(set(ours) - set(theirs))[:5], sorted(set(theirs) - set(ours))[:5])
    for key, e in theirs.items():
        row = ours[key]
        assert row["calls"] == e.count, key
        assert abs(row["total_ns"] / 1000 - e.cpu_time_total) <= 2, key   # torch keeps microseconds
        assert abs(row["self_ns"] / 1000 - e.self_cpu_time_total) <= 2, key
        if key[0] not in other_threads:
            assert row["cpu_memory_self_bytes"] == e.self_cpu_memory_usage, key
            assert row["cpu_memory_total_bytes"] == e.cpu_memory_usage, key


def _other_thread_names(p):
    main = next(e.thread for e in p.events() if e.name == "step")
    return frozenset(e.name for e in p.events() if e.thread != main)


@pytest.mark.parametrize("n", [1, 5])
def test_group_by_stack_n_matches_torch(tmp_path, n):
    """op_table(group_by_stack_n=N) equals torch's key_averages(group_by_stack_n=N) on the same run:
    the same (name, top-N frames) groups, calls, self/total CPU time and memory, whether the trace
    wrote the stacks (``Call stack``) or they are rebuilt from its Python function events."""
    from omniprof.analysis.torch_ops import op_table
    from omniprof.readers import KinetoReader

    read_trace = KinetoReader().read

    p, written, rebuilt = _stack_run(tmp_path)
    theirs = {(e.key, json.dumps(e.stack[:n])): e for e in p.key_averages(group_by_stack_n=n)}
    # not vacuous: ops under different stacks are different groups (two Linear layers, fwd and bwd)
    assert len([k for k in theirs if k[0] == "aten::addmm"]) >= (2 if n == 5 else 1)
    assert any(k[1] != "[]" for k in theirs)
    for path in (written, rebuilt):
        table = op_table(read_trace(path).parts[0], group_by_stack_n=n)
        assert table.name == "op_stats_by_stack" and table.columns[:3] == ("name", "stack", "calls")
        _assert_same_as_torch({(r["name"], r["stack"]): r for r in table.records()}, theirs, _other_thread_names(p))


def test_backward_ops_take_their_forward_ops_stack(tmp_path):
    """As in torch, an op run by autograd's backward is grouped under the Python stack of the forward
    op that created its node: AddmmBackward0 sits where the Linear layer's forward was called."""
    from omniprof.analysis.torch_ops import op_table
    from omniprof.readers import KinetoReader

    read_trace = KinetoReader().read

    _, _, rebuilt = _stack_run(tmp_path)
    rows = op_table(read_trace(rebuilt).parts[0], group_by_stack_n=5).records()
    fwd = {r["stack"] for r in rows if r["name"] == "aten::linear"}
    bwd = {r["stack"] for r in rows if r["name"] == "AddmmBackward0"}
    assert len(fwd) == 2 and bwd == fwd
    assert all("torch/nn/modules/linear.py" in s for s in fwd)


def test_op_stats_with_stacks_match_torch_key_averages(tmp_path):
    """With stacks recorded torch's key_averages() has a row per Python function and an annotation's
    self time excludes the Python code run inside it; the part's op_stats does the same."""
    from omniprof.readers import KinetoReader

    read_trace = KinetoReader().read

    p, _, rebuilt = _stack_run(tmp_path)
    theirs = {e.key: e for e in p.key_averages()}
    part = read_trace(rebuilt).parts[0]
    ours = {r["name"]: r for r in part.table("op_stats").records()}
    _assert_same_as_torch({(k,): r for k, r in ours.items()}, {(k,): e for k, e in theirs.items()},
                          _other_thread_names(p))
    step = ours["step"]
    assert step["self_ns"] < step["total_ns"] / 4  # the Python calls inside the range are its children


def test_group_by_input_shape_and_stack_together(tmp_path):
    """Both keys at once, as torch's key_averages(group_by_input_shape=True, group_by_stack_n=N)."""
    from omniprof.analysis.torch_ops import op_table
    from omniprof.readers import KinetoReader

    read_trace = KinetoReader().read

    p, _, rebuilt = _stack_run(tmp_path)
    theirs = {(e.key, str(e.input_shapes), json.dumps(e.stack[:3])): e
              for e in p.key_averages(group_by_input_shape=True, group_by_stack_n=3)}
    table = op_table(read_trace(rebuilt).parts[0], group_by_input_shape=True, group_by_stack_n=3)
    assert table.name == "op_stats_by_input_shape_and_stack"
    ours = {(r["name"], str(json.loads(r["input_shapes"])), r["stack"]): r for r in table.records()}
    _assert_same_as_torch(ours, theirs, _other_thread_names(p))


def test_group_by_stack_n_from_the_torch_backend_and_the_cli(tmp_path, capsys):
    """python_tracer_level=1 records the stacks; ``omniprof report -R table.group_by_stack_n=N`` shows
    the grouped table in place of op_stats, the same rows op_table() gives."""
    from omniprof.cli import main
    from omniprof.analysis.torch_ops import op_table

    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.ReLU(), torch.nn.Linear(32, 4))
    opts = omniprof.ProfileOptions(python_tracer_level=1, device_tracer_level=0)
    with omniprof.Profiler(backend="torch", options=opts) as prof:
        model(torch.randn(8, 16)).sum().backward()
    part = prof.result.part("torch")
    table = op_table(part, group_by_stack_n=4)
    addmm = [r for r in table.records() if r["name"] == "aten::addmm"]
    assert len(addmm) == 2 and all("nn.Module: Linear_" in r["stack"] for r in addmm)
    path = prof.result.save(tmp_path / "r.json")
    assert main(["report", str(path), "-R", "table.group_by_stack_n=4", "-R", "table.width=400"]) == 0
    out = capsys.readouterr().out
    assert "Op statistics by stack (torch key_averages(group_by_stack_n=4))" in out
    assert "Op statistics (torch key_averages)" not in out
    # as torch's table shows its Source Location: the stack last, one frame a line under its row
    lines = out.splitlines()
    header = next(i for i, ln in enumerate(lines) if ln.startswith("name") and "stack (innermost first)" in ln)
    at = lines[header].index("stack (innermost first)")
    first = next(i for i, ln in enumerate(lines) if i > header and ln.startswith("aten::addmm "))
    frames = json.loads(addmm[0]["stack"] if addmm[0]["self_ns"] >= addmm[1]["self_ns"] else addmm[1]["stack"])
    assert [ln[at:].rstrip() for ln in lines[first:first + len(frames)]] == frames
    assert all(not ln[:at].strip() for ln in lines[first + 1:first + len(frames)])
    assert main(["report", str(path), "-R", "table.group_by_stack_n=-1"]) != 0
    assert "group_by_stack_n" in capsys.readouterr().err


def test_group_by_stack_n_rejects_a_bad_n():
    from omniprof.core.results import BackendResult
    from omniprof.analysis.torch_ops import op_table

    with pytest.raises(omniprof.InvalidArgumentError, match="group_by_stack_n"):
        op_table(BackendResult("torch"), group_by_stack_n=-2)


def test_group_by_stack_n_with_step_ranges_matches_torch(tmp_path):
    """Steps (``ProfilerStep#N``, which torch merges as ``ProfilerStep*``) keep the stack torch wrote for
    them; summed over N they equal torch's row."""
    import re

    from torch.profiler import ProfilerActivity, profile, schedule

    from omniprof.analysis.torch_ops import op_table
    from omniprof.readers import KinetoReader

    read_trace = KinetoReader().read

    model = torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.ReLU(), torch.nn.Linear(32, 4))
    config = torch._C._profiler._ExperimentalConfig(verbose=True)
    with profile(activities=[ProfilerActivity.CPU], with_stack=True, experimental_config=config,
                 schedule=schedule(wait=0, warmup=1, active=3, repeat=1)) as p:
        for _ in range(6):
            model(torch.randn(4, 16)).sum().backward()
            p.step()
    trace = tmp_path / "steps.pt.trace.json"
    p.export_chrome_trace(str(trace))
    theirs = {(e.key, json.dumps(e.stack[:3])): e for e in p.key_averages(group_by_stack_n=3)}
    ours: dict = {}
    for r in op_table(read_trace(trace).parts[0], group_by_stack_n=3).records():
        key = (re.sub(r"^ProfilerStep#\d+$", "ProfilerStep*", r["name"]), r["stack"])
        got = ours.setdefault(key, {"calls": 0, "self_ns": 0, "total_ns": 0})
        for k in got:
            got[k] += r[k]
    assert set(ours) == set(theirs)
    step = next(k for k in theirs if k[0] == "ProfilerStep*")
    assert step[1] != "[]" and ours[step]["calls"] == theirs[step].count == 3
    for key, e in theirs.items():
        assert ours[key]["calls"] == e.count, key
        assert abs(ours[key]["self_ns"] / 1000 - e.self_cpu_time_total) <= 2, key


# -- group_by_stack_n against the program itself and the raw trace (no torch key_averages) -----------
def _site_a(m):
    for _ in range(3):
        torch.mm(m, m)


def _site_b(m):
    for _ in range(5):
        torch.mm(m, m)
    torch.add(m, m)
    torch.add(m, m)


def _site_c(m):
    _site_a(m)


def _sites(m):
    _site_a(m)
    _site_b(m)
    _site_c(m)


def _frame(fn) -> str:
    """The tail of torch's frame label for ``fn``: ``<file>(<first line>): <name>``."""
    import os

    return f"{os.path.basename(fn.__code__.co_filename)}({fn.__code__.co_firstlineno}): {fn.__name__}"


def _raw_groups(path, n):
    """The expected grouping computed straight from the Kineto JSON, independently of the reader: for
    each ``cpu_op`` event, the ``python_function`` events on its thread that hold it whole, innermost
    first (its Python stack); total time its duration, self time its duration minus its direct
    children's (``cpu_op`` and ``python_function`` events it holds whole, not inside another child)."""
    events = [e for e in json.loads(path.read_text())["traceEvents"]
              if e.get("ph") == "X" and e.get("cat") in ("cpu_op", "python_function")]

    def ns(e):
        return round(float(e["ts"]) * 1000), round((float(e["ts"]) + float(e["dur"])) * 1000)

    def holds(outer, inner):
        (s0, e0), (s1, e1) = ns(outer), ns(inner)
        return outer is not inner and outer["tid"] == inner["tid"] and s0 <= s1 and e1 <= e0 and \
            (s0, -e0) < (s1, -e1)

    groups: dict = {}
    for op in (e for e in events if e["cat"] == "cpu_op"):
        outer = sorted((p for p in events if p["cat"] == "python_function" and holds(p, op)),
                       key=lambda p: ns(p)[0])
        stack = [p["name"] for p in reversed(outer)][:n]
        inside = [c for c in events if holds(op, c)]
        direct = [c for c in inside if not any(holds(o, c) for o in inside)]
        s, e = ns(op)
        g = groups.setdefault((op["name"], json.dumps(stack)), {"calls": 0, "total_ns": 0, "self_ns": 0})
        g["calls"] += 1
        g["total_ns"] += e - s
        g["self_ns"] += e - s - sum(ns(c)[1] - ns(c)[0] for c in direct)
    return groups


@pytest.mark.parametrize("n", [2, 3])
def test_group_by_stack_n_against_the_program_and_the_raw_trace(tmp_path, n):
    """Ops called from known Python functions a known number of times, recorded by plain
    torch.profiler with with_stack=True (torch 2.x's default trace: no ``Call stack`` args, and torch's
    own key_averages(group_by_stack_n) gives every op an empty stack then). Calls per (op, call site)
    are what the program does; self and total CPU time per group are recomputed from the raw JSON."""
    from torch.profiler import ProfilerActivity, profile

    from omniprof.analysis.torch_ops import op_table
    from omniprof.readers import KinetoReader

    read_trace = KinetoReader().read

    m = torch.randn(48, 48)
    _sites(m)  # warm up
    with profile(activities=[ProfilerActivity.CPU], with_stack=True) as p:
        for _ in range(2):
            _sites(m)
    trace = tmp_path / "sites.pt.trace.json"
    p.export_chrome_trace(str(trace))
    table = op_table(read_trace(trace).parts[0], group_by_stack_n=n)
    got = {}
    for r in table.records():
        if r["name"] in ("aten::mm", "aten::add"):
            stack = json.loads(r["stack"])
            assert len(stack) == n and stack[0].startswith(f"<built-in method {r['name'][6:]} of ")
            got[(r["name"], *(next((f.__name__ for f in (_site_a, _site_b, _site_c, _sites)
                                    if frame.endswith(_frame(f))), frame) for frame in stack[1:]))] = r
    # what the program does: 2 rounds of _sites(); _site_a runs 3 mm, from _sites and from _site_c
    expected = ({("aten::mm", "_site_a"): 12, ("aten::mm", "_site_b"): 10, ("aten::add", "_site_b"): 4} if n == 2 else
                {("aten::mm", "_site_a", "_sites"): 6, ("aten::mm", "_site_a", "_site_c"): 6,
                 ("aten::mm", "_site_b", "_sites"): 10, ("aten::add", "_site_b", "_sites"): 4})
    assert {k: r["calls"] for k, r in got.items()} == expected
    raw = _raw_groups(trace, n)
    for r in table.records():
        ref = raw.get((r["name"], r["stack"]))
        if r["name"].startswith("aten::") and ref is not None:
            assert r["calls"] == ref["calls"], r
            assert abs(r["total_ns"] - ref["total_ns"]) <= r["calls"], r   # 1 ns rounding per call
            assert abs(r["self_ns"] - ref["self_ns"]) <= 2 * r["calls"], r
    # every op group of the raw trace is a row, and no row is missing from it
    ops = {(r["name"], r["stack"]) for r in table.records() if (r["name"], r["stack"]) in raw}
    assert ops == set(raw)


def test_group_by_stack_n_of_the_call_sites_matches_torch_with_verbose(tmp_path):
    """The same call-site program with ``_ExperimentalConfig(verbose=True)``, under which torch's own
    key_averages(group_by_stack_n=3) has stacks: its groups of aten::mm / aten::add, their calls and
    self/total CPU time equal ours, from the trace torch wrote (with ``Call stack``) and from the same
    trace without them (stacks rebuilt from the Python function events); the calls are the program's."""
    from torch.profiler import ProfilerActivity, profile

    from omniprof.analysis.torch_ops import op_table
    from omniprof.readers import KinetoReader

    read_trace = KinetoReader().read

    m = torch.randn(48, 48)
    _sites(m)
    config = torch._C._profiler._ExperimentalConfig(verbose=True)
    with profile(activities=[ProfilerActivity.CPU], with_stack=True, experimental_config=config) as p:
        _sites(m)
    written = tmp_path / "verbose.pt.trace.json"
    p.export_chrome_trace(str(written))
    data = json.loads(written.read_text())
    for e in data["traceEvents"]:
        (e.get("args") or {}).pop("Call stack", None)
    rebuilt = tmp_path / "rebuilt.pt.trace.json"
    rebuilt.write_text(json.dumps(data))
    theirs = {(e.key, json.dumps(e.stack[:3])): e for e in p.key_averages(group_by_stack_n=3)
              if e.key in ("aten::mm", "aten::add")}
    sites = {k: e.count for k, e in theirs.items()}
    assert sorted(sites.values()) == [2, 3, 3, 5]  # add x2 and mm x5 in _site_b, mm x3 from each caller of _site_a
    assert all(_frame(_site_a) in k[1] or _frame(_site_b) in k[1] for k in sites)
    for path in (written, rebuilt):
        ours = {(r["name"], r["stack"]): r for r in op_table(read_trace(path).parts[0], group_by_stack_n=3).records()
                if r["name"] in ("aten::mm", "aten::add")}
        assert set(ours) == set(theirs)
        for key, e in theirs.items():
            assert ours[key]["calls"] == e.count, key
            assert abs(ours[key]["total_ns"] / 1000 - e.cpu_time_total) <= 2, key
            assert abs(ours[key]["self_ns"] / 1000 - e.self_cpu_time_total) <= 2, key
