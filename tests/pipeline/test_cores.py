"""The training thread's core and the loader's: the placement plan on given topologies, and a real
loader (worker processes, the GPU path's decode threads) put where the plan says while it runs."""

from __future__ import annotations

import os
import threading

import pytest

from infclip.pipeline.data import build as build_mod
from infclip.pipeline.data import cores
from infclip.pipeline.data.cores import CorePlan, MIN_CORES_PER_RANK, parse_cpu_list, physical_cores, plan_cores
from infclip.pipeline.data.tokenizer import load_tokenizer

from .test_gpu_decode import _loader, _mixed_shards


@pytest.fixture(scope="module")
def tok(digits_shards):
    return load_tokenizer(digits_shards["tokenizer_dir"])


def _smt(n_cores: int):
    """A host of ``n_cores`` physical cores with two hyperthreads each, numbered as Linux does on
    x86 (core i is CPUs i and i + n_cores)."""
    return lambda cpu: [cpu % n_cores, cpu % n_cores + n_cores]


def test_cpu_lists_parse_as_the_kernel_writes_them():
    assert parse_cpu_list("0-3,8,10-11\n") == [0, 1, 2, 3, 8, 10, 11]
    assert parse_cpu_list("5") == [5]
    assert parse_cpu_list("") == []


def test_cpus_group_into_physical_cores_within_the_allowed_set():
    assert physical_cores(range(8), _smt(4)) == [(0, 4), (1, 5), (2, 6), (3, 7)]
    # a cgroup that allows only some hyperthreads: each core keeps the allowed ones
    assert physical_cores([0, 1, 5, 6], _smt(4)) == [(0,), (1, 5), (6,)]
    assert physical_cores([2, 0, 1], lambda cpu: [cpu]) == [(0,), (1,), (2,)]


def test_each_local_rank_gets_its_own_core_and_the_loader_none_of_them():
    host = list(range(32))  # 16 cores, 2 hyperthreads each
    alone = plan_cores(0, 1, host, _smt(16))
    assert alone == CorePlan(training=(15, 31), loader=tuple(c for c in range(15) for c in (c, c + 16)))
    plans = [plan_cores(r, 4, host, _smt(16)) for r in range(4)]
    assert [p.training for p in plans] == [(15, 31), (14, 30), (13, 29), (12, 28)]
    reserved = {cpu for p in plans for cpu in p.training}
    assert all(p.loader == plans[0].loader for p in plans)
    assert not reserved & set(plans[0].loader) and reserved | set(plans[0].loader) == set(host)


def test_no_plan_without_room_for_one():
    assert plan_cores(0, 1, range(2 * (MIN_CORES_PER_RANK - 1)), _smt(MIN_CORES_PER_RANK - 1)) is None
    assert plan_cores(0, 2, range(2 * (2 * MIN_CORES_PER_RANK - 1)), _smt(2 * MIN_CORES_PER_RANK - 1)) is None
    assert plan_cores(0, 1, range(MIN_CORES_PER_RANK), lambda cpu: [cpu]) is not None
    with pytest.raises(ValueError, match="local rank 2 outside 2"):
        plan_cores(2, 2, range(64), lambda cpu: [cpu])


def _children() -> set:
    me, out = os.getpid(), set()
    for pid in os.listdir("/proc"):
        if pid.isdigit():
            try:
                with open(f"/proc/{pid}/stat") as f:
                    fields = f.read().rsplit(")", 1)[1].split()
            except OSError:
                continue
            if int(fields[1]) == me and fields[0] != "Z":
                out.add(int(pid))
    return out


@pytest.mark.skipif(not hasattr(os, "sched_setaffinity") or len(os.sched_getaffinity(0)) < 2,
                    reason="needs Linux and two CPUs")
@pytest.mark.parametrize("decode,pin", [("cpu", True), ("gpu", True), ("gpu", False)])
def test_a_training_loader_puts_its_threads_where_the_plan_says_while_it_runs(tmp_path, tok, monkeypatch, decode, pin):
    """data.reserve_training_core with a plan of one CPU each: while the loader is iterated the
    training thread is on its CPU (without PIN_TRAINING_THREAD: where it was) and every worker
    process and decode thread on the loader's; when the loader ends the training thread is back
    where it was."""
    a, b = sorted(os.sched_getaffinity(0))[:2]
    monkeypatch.setattr(build_mod, "plan_cores", lambda *_: CorePlan(training=(b,), loader=(a,)))
    monkeypatch.setattr(cores, "PIN_TRAINING_THREAD", pin)
    url = _mixed_shards(tmp_path / "mixed")
    before, old_children = os.sched_getaffinity(0), _children()
    loader = _loader(url, tok, decode, reserve_training_core=True)
    batches, workers_seen = 0, set()
    for _ in loader:
        batches += 1
        assert os.sched_getaffinity(0) == ({b} if pin else before)
        workers = _children() - old_children  # those still running: the last batches may come after both ended
        assert len(workers) <= 2 and all(os.sched_getaffinity(p) == {a} for p in workers)
        workers_seen |= workers
        decode_threads = [t.native_id for t in threading.enumerate() if t.name.startswith("infclip-decode-")]
        assert len(decode_threads) >= (2 if decode == "gpu" else 0)  # the feeder and a lane
        assert all(os.sched_getaffinity(tid) == {a} for tid in decode_threads)
    assert batches == 6 and workers_seen
    assert os.sched_getaffinity(0) == before


def test_the_setting_off_leaves_placement_alone(tmp_path, tok, monkeypatch):
    monkeypatch.setattr(build_mod, "plan_cores", lambda *_: pytest.fail("planned without the setting"))
    before = os.sched_getaffinity(0) if hasattr(os, "sched_getaffinity") else None
    for _ in _loader(_mixed_shards(tmp_path / "mixed"), tok, "cpu"):
        if before is not None:
            assert os.sched_getaffinity(0) == before
