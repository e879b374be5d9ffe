"""bench/bench_stream.py's profile summary, on a trace written as torch.profiler writes one: stream
times, the union of kernel time, and the CUDA runtime calls of every thread, of the training
thread alone and of the decode threads; and its rows, written as their anchors complete."""

from __future__ import annotations

import json
import os
import sys
import threading
import time

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "bench"))
import bench_stream  # noqa: E402


def _trace(tmp_path, events):
    path = tmp_path / "trace.json"
    path.write_text(json.dumps({"traceEvents": [{"ph": "X", **e} for e in events]}))
    return str(path)


def test_the_profile_summary_splits_streams_kernel_time_and_the_training_threads_calls(tmp_path):
    us = 1000  # the trace counts microseconds
    path = _trace(tmp_path, [
        # two steps: the step's stream 7, a decode lane's stream 9 overlapping it by 2 ms
        {"cat": "kernel", "ts": 0, "dur": 10 * us, "args": {"stream": 7}},
        {"cat": "kernel", "ts": 8 * us, "dur": 4 * us, "args": {"stream": 9}},
        {"cat": "gpu_memcpy", "ts": 12 * us, "dur": 1 * us, "args": {"stream": 9}},
        {"cat": "kernel", "ts": 20 * us, "dur": 10 * us, "args": {"stream": 7}},
        # runtime calls: the training thread (11) launches, a decode thread (12) copies
        {"cat": "cuda_runtime", "name": "cudaLaunchKernel", "tid": 11, "ts": 0, "dur": 3 * us},
        {"cat": "cuda_runtime", "name": "cudaLaunchKernel", "tid": 11, "ts": 5 * us, "dur": 5 * us},
        {"cat": "cuda_runtime", "name": "cudaMemcpyAsync", "tid": 12, "ts": 1 * us, "dur": 20 * us},
        {"cat": "cuda_runtime", "name": "cudaLaunchKernel", "tid": 12, "ts": 2 * us, "dur": 2 * us},
        {"cat": "cpu_op", "name": "aten::mm", "tid": 11, "ts": 0, "dur": 50 * us},
    ])
    got = bench_stream.gpu_timeline(path, steps=2, training_thread=11, decode_threads=[12])
    assert got["kernel_busy_ms"] == 11.0  # (0-12 ms, the overlap once) + 10 ms, over 2 steps
    assert got["kernel_span_ms"] == 15.0  # first kernel's start to the last one's end
    assert got["streams"] == {"stream 7 kernels": [1.0, 10.0], "stream 9 kernels": [0.5, 2.0],
                              "stream 9 copies": [0.5, 0.5]}
    # count and ms a step, and the longest single call
    assert got["runtime_calls"] == {"cudaMemcpyAsync": [0.5, 10.0, 20.0], "cudaLaunchKernel": [1.5, 5.0, 5.0]}
    assert got["training_thread_calls"] == {"cudaLaunchKernel": [1.0, 4.0, 5.0]}
    assert got["decode_thread_calls"] == {"cudaMemcpyAsync": [0.5, 10.0, 20.0], "cudaLaunchKernel": [0.5, 1.0, 2.0]}
    # no thread named: every call is counted, none as the training thread's or a decode thread's
    unnamed = bench_stream.gpu_timeline(path, steps=2)
    assert unnamed["training_thread_calls"] == {} and unnamed["decode_thread_calls"] == {}


def test_rows_are_written_as_their_anchors_complete_and_once(tmp_path):
    """A streamed phase's row is written once the synthetic phases on either side have run, with
    their mean as its anchor; a call cut short keeps the rows already anchored; none twice."""
    out = tmp_path / "rows.jsonl"
    phases = [("synthetic", 100.0), ("web512:gpu", 90.0), ("synthetic", 80.0), ("web256:gpu", 85.0), ("synthetic", 90.0)]
    rows, written = [], 0
    for phase, rate in phases[:3]:  # cut short after the second anchor
        rows.append({"phase": phase, "samples_per_s": rate})
        written = bench_stream.write_anchored(rows, written, str(out))
    kept = [json.loads(line) for line in out.read_text().splitlines()]
    assert [r["phase"] for r in kept] == ["synthetic", "web512:gpu"]
    assert kept[1]["anchor_samples_per_s"] == 90.0 and abs(kept[1]["ratio"] - 1.0) < 1e-12
    for phase, rate in phases[3:]:
        rows.append({"phase": phase, "samples_per_s": rate})
        written = bench_stream.write_anchored(rows, written, str(out))
    bench_stream.write_anchored(rows, written, str(out), final=True)
    kept = [json.loads(line) for line in out.read_text().splitlines()]
    assert [r["phase"] for r in kept] == [p for p, _ in phases]
    assert kept[3]["anchor_samples_per_s"] == 85.0 and kept[3]["ratio"] == 1.0
    assert kept[0]["anchor_samples_per_s"] == 100.0  # a synthetic row's own rate where no synthetic is beside it


def test_the_resized_copy_set_is_the_512_px_set_as_make_shards_copies_it(tmp_path):
    """web512as256: the web512 shards, each image's shorter side 256, the same captions in order."""
    import io
    import tarfile

    from PIL import Image

    def members(path):
        with tarfile.open(path) as tar:
            return [(m.name, tar.extractfile(m).read()) for m in tar.getmembers()]

    (large,), (small,) = bench_stream.image_set(str(tmp_path), "web512", 1, 3), \
        bench_stream.image_set(str(tmp_path), "web512as256", 1, 3)
    before, after = members(large), members(small)
    assert [n for n, _ in before] == [n for n, _ in after]
    assert [d for n, d in before if n.endswith(".txt")] == [d for n, d in after if n.endswith(".txt")]
    for name, data in after:
        if name.endswith(".jpg"):
            with Image.open(io.BytesIO(data)) as img:
                assert min(img.size) == 256, img.size


def test_the_decode_threads_cpu_time_is_theirs_alone():
    """A thread named as a decode lane is counted, its CPU time growing as it works; another
    thread working as hard beside it is not (both hash outside the interpreter lock, so on two
    cores each gets about the wall time: counted together they would read about twice that)."""
    import hashlib
    import threading
    import time

    block = bytes(1 << 20)

    def burn(stop):
        while not stop.is_set():
            hashlib.sha256(block).digest()

    stop = threading.Event()
    before = bench_stream._host_now()
    t0 = time.perf_counter()
    lane = threading.Thread(target=burn, args=(stop,), name="infclip-decode-0_0")
    other = threading.Thread(target=burn, args=(stop,), name="someone-else")
    lane.start(), other.start()
    time.sleep(1.0)
    during = bench_stream._host_now()
    wall = time.perf_counter() - t0
    stop.set()
    lane.join(), other.join()
    assert before["decode_cpu_s"] == 0.0  # no lane yet
    assert 0.3 * wall <= during["decode_cpu_s"] <= 1.05 * wall + 0.02
    assert bench_stream._host_now()["decode_cpu_s"] == 0.0  # the lane has ended: nothing counted


def test_the_gpu_clock_sampler_reads_nvidia_smi_and_keeps_only_throttle_reasons(tmp_path, monkeypatch):
    # a stand-in nvidia-smi on PATH printing as the real one does with --format=csv,noheader,nounits
    smi = tmp_path / "nvidia-smi"
    smi.write_text("#!/bin/sh\n"
                   "echo '1980, 650.5, 61, 0x0000000000000001'\n"  # idle: not a throttle
                   "echo '1755, 699.5, 64, 0x0000000000000004'\n"  # software power cap
                   "echo '[N/A], [N/A], [N/A], [N/A]'\n"
                   "exec sleep 30\n")
    smi.chmod(0o755)
    monkeypatch.setenv("PATH", f"{tmp_path}{os.pathsep}{os.environ['PATH']}")
    clocks = bench_stream.GpuClocks(0)
    time.sleep(1.0)
    got = clocks.stop()
    assert got == {"sm_clock_mhz": 1867.5, "sm_clock_min_mhz": 1755.0, "power_w": 675.0, "temperature_c": 64.0,
                   "clock_event_reasons": "0x4", "clock_samples": 2}
    monkeypatch.setenv("PATH", str(tmp_path / "empty"))
    assert bench_stream.GpuClocks(0).stop() == {}


def test_the_interpreter_lock_probe_sees_a_thread_running_python():
    quiet = bench_stream.GilProbe()
    time.sleep(0.3)
    idle = quiet.stop()
    stop = time.perf_counter() + 0.6
    busy = bench_stream.GilProbe()

    def spin():  # pure Python: holds the lock until the switch interval asks for it
        while time.perf_counter() < stop:
            pass

    spinner = threading.Thread(target=spin)
    spinner.start()
    spinner.join()
    contended = busy.stop()
    assert contended["gil_late_ms"] > idle["gil_late_ms"]
    # behind a spinning thread each wake-up waits about a switch interval (5 ms)
    assert contended["gil_late_ms"] > 0.5 * 1e3 * sys.getswitchinterval()


def test_thread_samples_sort_each_threads_stacks_by_what_it_waits_for():
    """py-spy's raw lines (outermost frame first, the count last) -> each thread role's shares: the
    interpreter lock's timed wait under torch's re-acquire, a CUDA event sync, a driver call, a queue
    wait, and running code."""
    import thread_samples

    lib, c = "(libtorch_python.so)", "(libc.so.6)"
    lines = [
        f"thread (101): MainThread;step (loop.py:330);THPVariable_add_ {lib};pybind11::gil_scoped_release::~gil_scoped_release {lib};pthread_cond_timedwait {c};0x7f01 {c} 6",
        f"thread (101): MainThread;_check (step.py:72);THCPEvent_synchronize {lib};cudaEventSynchronize (libcudart.so.12);0x7f02 (libcuda.so.1) 3",
        "thread (101): MainThread;step (loop.py:331);cuLaunchKernel (libcuda.so.1);0x7f03 (libcuda.so.1) 2",
        "thread (101): MainThread;step (loop.py:332);at::native::add_kernel (libtorch_cpu.so) 1",
        f"thread (102): infclip-decode-0_0;get (queue.py:171);lock_PyThread_acquire_lock (python3.12);PyThread_acquire_lock_timed (python3.12);sem_clockwait {c} 4",
        f"thread (103): infclip-decode-feed;feed (gpu_decode.py:460);PyEval_RestoreThread (python3.12);pthread_cond_timedwait {c} 1",
        "thread (104): Thread-3 (_pin_memory_loop);_pin_memory_loop (pin_memory.py:50);fn (x.py:1) 2",
        "not a sample line",
    ]
    got = thread_samples.summarize(lines)
    training = got["training"]
    assert training["samples"] == 12
    assert (training["gil"], training["gpu_wait"], training["cuda"], training["cpu"]) == (0.5, 0.25, round(2 / 12, 4),
                                                                                           round(1 / 12, 4))
    assert training["top"][0][0].startswith("gil: ")
    assert got["decode"] == {"samples": 4, "idle": 1.0}
    assert got["feed"] == {"samples": 1, "gil": 1.0}
    assert got["pin"] == {"samples": 2, "cpu": 1.0}


def test_thread_samples_record_this_process_with_py_spy():
    """A real recording, where py-spy is installed: a thread spinning in Python keeps the main
    thread's torch calls waiting for the interpreter lock."""
    import shutil

    import pytest
    import torch

    import thread_samples

    if shutil.which("py-spy") is None:
        pytest.skip("py-spy is not installed")
    stop = threading.Event()

    def spin():
        while not stop.is_set():
            sum(range(10000))

    spinner = threading.Thread(target=spin, name="infclip-decode-0_0")
    spinner.start()
    sampler = thread_samples.ThreadSamples(rate=100)
    try:
        time.sleep(0.5)  # py-spy attaches
        x, t0 = torch.zeros(64), time.perf_counter()
        while time.perf_counter() - t0 < 1.5:
            x.add_(1)
    finally:
        stop.set()
        spinner.join()
        got = sampler.stop()
    assert "error" not in got, got
    assert got["decode"]["cpu"] > 0.8
    assert got["training"].get("gil", 0.0) > 0.2


def test_the_collection_watch_counts_collections_by_generation_and_thread():
    """A full collection run in another thread is counted as gen2 and as another thread's time; one run
    here, as the training thread's."""
    import gc

    watch = bench_stream.GcWatch()
    gc.collect(0)
    other = threading.Thread(target=gc.collect, args=(2,))
    other.start()
    other.join()
    got = watch.stop()
    assert got["gc0"][0] >= 1 and got["gc2"][0] >= 1
    assert got["gc_other_threads_ms"] > 0
    assert watch._note not in gc.callbacks


def test_the_loop_flags_leave_the_loader_flags_alone():
    """+leadN and +nogc set the training loop and are taken out of the decode spec the loader gets;
    a malformed +lead stays in it, for the loader to refuse."""
    assert bench_stream._loop_flags("gpu%0+lead2+interleaved+nogc") == ("gpu%0+interleaved", 2, False)
    assert bench_stream._loop_flags("gpu") == ("gpu", 1, True)
    assert bench_stream._loop_flags("gpu+leadx") == ("gpu+leadx", 1, True)
