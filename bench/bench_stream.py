"""A preset's training step streamed from JPEG shards against the same step on batches already on the GPU.

Design: one process, one DeepSpeed engine built from the preset (compiled once), the project's
own training loop (:class:`pipeline.train.loop.TrainLoop`) run phase after phase on the same engine:
``synthetic`` (one real batch kept on the device and fed again every micro-step: the step with
no data cost at all, the anchor), then the shard loader on each image set and decode mode asked
for, each followed by ``synthetic`` again. Each phase runs ``--warmup``
steps (loader start, shuffle buffer, compile) and then ``--steps`` timed ones; samples/s is
those steps over their wall time, from one device sync to the next. The ratio of a streamed
phase to the mean of the synthetic phases on either side of it (the GPU's clock drifts over a
call as it heats) is what the data path costs the step: loader
starvation and, with ``gpu`` decode, the decode kernels sharing the GPU with the step. A phase's
loader is closed when the phase ends (its worker processes and decode threads stop): left open,
they slow every later phase, the anchors included. Each row also says where the step's time went
on the host (the training thread's CPU time a step and how often it was descheduled; the same
for the decode stage's threads together), the GPU's SM clock, power and clock-event reasons
while the timed steps ran (``nvidia-smi``), how long a thread waits for the interpreter lock
(:class:`GilProbe`), the garbage collections (:class:`GcWatch`), and, with
``gpu`` decode, the GPU time the step's stream stood waiting for a batch (``gpu_stall_fraction``);
``--profile N`` adds each CUDA stream's kernel time a step from ``torch.profiler``;
``--sample_threads N`` each thread's waits from py-spy (:mod:`thread_samples`).

Image sets (written once per ``--dir``, several processes rendering them): ``web256`` /
``web512``: smooth colour fields with shapes, baseline JPEG quality 90 (``bench_data.picture``;
the sizes of web images cut to 256 px, or left at 512 px), with the preset's random resized crop
(``--crop_scale``); ``web256mixed``: the same with a fifth progressive and a tenth greyscale, as
web images come (nvJPEG's batched decoder takes neither: the loader workers decode those);
``web512as256``: the web512 shards copied by ``make_shards.py --shards URL --resize 256``; ``scenes224``: the rendered
scenes at 224 px, used whole (the scenes presets' ``crop_scale`` [1, 1]). One JSONL row per
phase in bench/results/stream.jsonl.

Run (one GPU): ``python bench/bench_stream.py --preset ds_configs/vitb32.json --micro_batch 256
--sets web256:gpu web512:gpu web256:cpu`` (``--set KEY=VALUE``: a config override on the preset).
"""

from __future__ import annotations

import argparse
import datetime
import gc
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from concurrent.futures import ProcessPoolExecutor
from typing import Optional, Sequence

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import torch  # noqa: E402

from bench_data import write_jpeg_shards  # noqa: E402
from gpu_queue import carve_sms  # noqa: E402
from thread_samples import ThreadSamples  # noqa: E402
from infclip.pipeline.config import load_config  # noqa: E402


PADDING = (16 << 20, 8 << 20)  # "+pad": nvJPEG's device and pinned allocations padded by these bytes


def _write_set(args: tuple) -> str:
    out_dir, first, shards, per_shard, size, mixed = args
    return write_jpeg_shards(out_dir, shards, per_shard, size=size, first_shard=first, seed=first, mixed=mixed)


def image_set(work: str, name: str, shards: int, per_shard: int) -> list:
    """The set's shard paths under ``work`` (written in parallel the first time)."""
    import glob

    out_dir = os.path.join(work, name)
    found = sorted(glob.glob(os.path.join(out_dir, "*.tar")))
    if len(found) >= shards:
        return found[:shards]
    if name.startswith("scenes"):
        import subprocess

        size = name[len("scenes"):]
        subprocess.run([sys.executable, os.path.join(ROOT, "launch", "make_shards.py"), "--scenes",
                        str(shards * per_shard), "--out", out_dir, "--scene-size", size, "--samples-per-shard",
                        str(per_shard), "--eval-samples", "100", "--retrieval-samples", "100"], check=True)
        return sorted(glob.glob(os.path.join(out_dir, "train", "*.tar")))[:shards]
    if "as" in name:  # web512as256: the web512 set copied as make_shards.py --shards --resize 256 copies it
        from infclip.pipeline.data.shards import resize_shards

        base, _, side = name.partition("as")
        resize_shards(image_set(work, base, shards, per_shard), out_dir, int(side), overwrite=True)
        return sorted(glob.glob(os.path.join(out_dir, "*.tar")))[:shards]
    mixed = name.endswith("mixed")
    size = int(name[len("web"):len(name) - (5 if mixed else 0)])
    jobs = [(out_dir, i, 1, per_shard, size, mixed) for i in range(shards)]
    with ProcessPoolExecutor(max_workers=min(len(jobs), os.cpu_count() or 1)) as pool:
        list(pool.map(_write_set, jobs))
    return sorted(glob.glob(os.path.join(out_dir, "*.tar")))[:shards]


class _Synthetic:
    """One batch on the device, handed out again and again (the step without a data path)."""

    def __init__(self, batch: dict) -> None:
        self.batch = batch

    def __iter__(self):
        while True:
            yield dict(self.batch)


def gpu_timeline(trace_path: str, steps: int, training_thread: Optional[int] = None,
                 decode_threads: Sequence[int] = ()) -> dict:
    """Per step, from a torch.profiler trace: each CUDA stream's kernels and copies (count, ms),
    the time any kernel ran (ms, the union over streams) and the host's CUDA runtime calls by name
    (count and ms a step, and the longest single call in ms), of all threads, of ``training_thread``
    (its native id) alone and of ``decode_threads`` (native ids) together. Where the step's GPU time
    goes while a phase decodes, whose calls slow it, and whether a call waits on the GPU (a call
    far longer than its mean)."""
    import collections

    with open(trace_path) as f:
        events = [e for e in json.load(f)["traceEvents"] if e.get("ph") == "X"]
    streams = collections.defaultdict(lambda: [0, 0.0])
    calls, mine, decoders = (collections.defaultdict(lambda: [0, 0.0, 0.0]) for _ in range(3))
    decode_threads = set(decode_threads)
    spans = []
    for e in events:
        cat, dur = e.get("cat"), e.get("dur", 0) / 1e3
        if cat in ("kernel", "gpu_memcpy", "gpu_memset"):
            key = f"stream {e.get('args', {}).get('stream', e.get('tid'))} {'kernels' if cat == 'kernel' else 'copies'}"
            streams[key][0] += 1
            streams[key][1] += dur
            if cat == "kernel":
                spans.append((e["ts"], e["ts"] + e.get("dur", 0)))
        elif cat == "cuda_runtime":
            tid = e.get("tid")
            for d in (calls, mine if tid == training_thread else None, decoders if tid in decode_threads else None):
                if d is not None:
                    d[e["name"]][0] += 1
                    d[e["name"]][1] += dur
                    d[e["name"]][2] = max(d[e["name"]][2], dur)
    busy, end = 0.0, float("-inf")
    for a, b in sorted(spans):
        if b > end:
            busy += b - max(a, end)
            end = b
    wall = (max(b for _, b in spans) - min(a for a, _ in spans)) / 1e3 if spans else 0.0
    per = lambda d: {k: [round(v[0] / steps, 1), round(v[1] / steps, 2)] + ([round(v[2], 3)] if len(v) > 2 else [])  # noqa: E731
                     for k, v in sorted(d.items(), key=lambda kv: -kv[1][1])}
    return {"kernel_busy_ms": busy / 1e3 / steps, "kernel_span_ms": wall / steps, "streams": per(streams),
            "runtime_calls": per(calls), "training_thread_calls": per(mine), "decode_thread_calls": per(decoders)}


def _host_now() -> dict:
    """The training thread's CPU seconds and involuntary context switches (it was runnable and another
    thread got its core), this process's threads and its live child processes."""
    switches = _context_switches("/proc/thread-self/status")
    voluntary = _context_switches("/proc/thread-self/status", "voluntary_ctxt_switches")
    me, children = os.getpid(), 0
    for pid in os.listdir("/proc"):
        if pid.isdigit():
            try:
                with open(f"/proc/{pid}/stat") as f:
                    children += int(f.read().rsplit(")", 1)[1].split()[1]) == me
            except OSError:
                continue
    decode_cpu, decode_switches = _decode_threads_cpu()
    with open("/proc/stat") as f:  # the host's CPU time in clock ticks: user nice system idle iowait irq softirq steal
        host = [int(v) for v in f.readline().split()[1:9]]
    return {"cpu_s": time.thread_time(), "switches": switches, "voluntary": voluntary,
            "threads": len(os.listdir("/proc/self/task")), "children": children, "decode_cpu_s": decode_cpu,
            "decode_switches": decode_switches, "host_ticks": host}


def _host_shares(h0: dict, h1: dict) -> dict:
    """The host's cores between two :func:`_host_now` readings: the share busy and the share stolen by
    the hypervisor for other guests (a virtual machine's cores slowed by its neighbours show here,
    not as context switches)."""
    d = [b - a for a, b in zip(h0["host_ticks"], h1["host_ticks"])]
    total = sum(d) or 1
    return {"host_busy": round((total - d[3] - d[4]) / total, 4), "host_steal": round(d[7] / total, 4)}


def _context_switches(status: str, field: str = "nonvoluntary_ctxt_switches") -> int:
    """A task's context switches from its /proc status file: involuntary ones (it was runnable and
    another thread got its core), or with ``field`` "voluntary_ctxt_switches" the times it blocked
    (a lock, a wait)."""
    with open(status) as f:
        return next((int(line.split()[1]) for line in f if line.startswith(field + ":")), 0)


def _decode_threads() -> list:
    """The native ids of the decode stage's threads (``infclip-decode-*``: the lanes and their feeder)."""
    return [t.native_id for t in threading.enumerate() if t.name.startswith("infclip-decode-") and t.native_id]


def _decode_threads_cpu() -> tuple:
    """The decode stage's threads (:func:`_decode_threads`) together: CPU seconds (user and system,
    from /proc at the clock-tick resolution) and involuntary context switches. A lane's nvJPEG call
    that takes longer with the same CPU time was waiting (a lock, the driver); with more switches,
    for a core."""
    tick = os.sysconf("SC_CLK_TCK")
    cpu, switches = 0.0, 0
    for tid in _decode_threads():
        try:
            with open(f"/proc/self/task/{tid}/stat") as f:
                fields = f.read().rsplit(")", 1)[1].split()
            cpu += (int(fields[11]) + int(fields[12])) / tick  # utime, stime
            switches += _context_switches(f"/proc/self/task/{tid}/status")
        except OSError:
            continue  # the thread ended between the listing and the read
    return cpu, switches


def renice_decode_threads(nice: int) -> int:
    """Give the decode stage's threads (:func:`_decode_threads`) the scheduling niceness ``nice``
    (Linux: a thread is a task of its own), so that the training thread wins a contested core; how
    many were changed."""
    tids = _decode_threads()
    for tid in tids:
        os.setpriority(os.PRIO_PROCESS, tid, nice)
    return len(tids)


class GcWatch:
    """The interpreter's garbage collections while a phase's timed steps run: how many of each
    generation, their total and longest time, and the share run by threads other than the training
    thread (a collection holds the interpreter lock throughout, so every other thread that needs
    it waits for its whole length)."""

    def __init__(self) -> None:
        self.runs: list = []
        self._start: dict = {}
        self._main = threading.main_thread().ident
        gc.callbacks.append(self._note)

    def _note(self, phase: str, info: dict) -> None:
        me = threading.get_ident()
        if phase == "start":
            self._start[me] = time.perf_counter()
        elif me in self._start:
            self.runs.append((info["generation"], time.perf_counter() - self._start.pop(me), me == self._main))

    def stop(self) -> dict:
        if self._note in gc.callbacks:
            gc.callbacks.remove(self._note)
        out: dict = {}
        for gen in (0, 1, 2):
            times = [t for g, t, _ in self.runs if g == gen]
            out[f"gc{gen}"] = [len(times), round(1e3 * sum(times), 2), round(1e3 * max(times, default=0.0), 2)]
        out["gc_other_threads_ms"] = round(1e3 * sum(t for _, t, main in self.runs if not main), 2)
        return out


class GilProbe:
    """A thread that sleeps 1 ms again and again and records how late each sleep returns. Waking
    needs the interpreter lock, so lateness is the wait any thread of the process meets for that
    lock after a call that released it (a CUDA sync, the nvJPEG call): about 0.1 ms on a free lock,
    up to the switch interval (``sys.getswitchinterval``, 5 ms) behind a thread running Python."""

    def __init__(self) -> None:
        self.late: list = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="bench-gil-probe", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while not self._stop.is_set():
            t0 = time.perf_counter()
            time.sleep(1e-3)
            self.late.append(time.perf_counter() - t0 - 1e-3)

    def stop(self) -> dict:
        self._stop.set()
        self._thread.join()
        late = sorted(self.late)
        if not late:
            return {}
        return {"gil_late_ms": 1e3 * sum(late) / len(late), "gil_late_p99_ms": 1e3 * late[int(0.99 * (len(late) - 1))]}


class GpuClocks:
    """``nvidia-smi`` sampling the GPU every 200 ms while a phase's timed steps run: its SM clock,
    power draw, temperature and active clock-event (throttle) reasons. A phase slowed by the GPU
    holding a lower clock (power cap, heat) shows it here, not in the loader's counters. Nothing is
    sampled where ``nvidia-smi`` is missing."""

    FIELDS = "clocks.sm,power.draw,temperature.gpu,clocks_event_reasons.active"

    def __init__(self, device_index: int) -> None:
        visible = os.environ.get("CUDA_VISIBLE_DEVICES", "").split(",")
        index = visible[device_index] if device_index < len(visible) and visible[device_index].strip().isdigit() \
            else str(device_index)
        exe = shutil.which("nvidia-smi")
        line_buffered = ["stdbuf", "-oL"] if shutil.which("stdbuf") else []  # each sample reaches the pipe as taken
        self.proc = subprocess.Popen(
            line_buffered + [exe, f"--query-gpu={self.FIELDS}", "--format=csv,noheader,nounits", "-lms", "200", "-i", index],
            stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True) if exe else None

    def stop(self) -> dict:
        if self.proc is None:
            return {}
        self.proc.send_signal(signal.SIGINT)  # nvidia-smi's loop ends on an interrupt as on Ctrl+C
        try:
            out, _ = self.proc.communicate(timeout=10)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            out, _ = self.proc.communicate()
        samples = []
        for line in out.splitlines():
            try:
                sm, power, temp, reasons = (v.strip() for v in line.split(","))
                samples.append((float(sm), float(power), float(temp), int(reasons, 16)))
            except ValueError:
                continue
        if not samples:
            return {}
        sm, power, temp, reasons = zip(*samples)
        active = 0
        for r in reasons:
            active |= r & ~0x1  # 0x1: idle, not a throttle
        return {"sm_clock_mhz": sum(sm) / len(sm), "sm_clock_min_mhz": min(sm), "power_w": sum(power) / len(power),
                "temperature_c": max(temp), "clock_event_reasons": hex(active), "clock_samples": len(samples)}


def run_phase(te, run_cfg, build, warmup: int, steps: int, profile: int = 0, nice: Optional[int] = None,
              sampled: int = 0, lead: int = 1, collect: bool = True, sample_path: Optional[str] = None,
              sample_rate: int = 100, sample_native: bool = True) -> dict:
    """``warmup`` + ``steps`` steps of the training loop on ``build``'s batches; the timed ones' rate
    (and, with ``profile``, that many more steps under torch.profiler: :func:`gpu_timeline`; with
    ``sampled``, that many more with each thread's stack sampled by py-spy:
    :class:`thread_samples.ThreadSamples`). With ``nice``, the decode threads run at that niceness
    from the end of the warm-up; ``lead``: the micro-steps the host runs ahead of the GPU
    (:class:`pipeline.train.step.LossGuard`); ``collect`` False: the interpreter's automatic garbage
    collection off while the timed steps run. ``sample_path``: where py-spy's raw samples are kept;
    ``sample_rate``: samples a second; ``sample_native`` False: Python frames only."""
    from infclip.pipeline.train.loop import Batches, EvalSchedule, TrainLoop
    from infclip.pipeline.train.metrics import TrainLogger
    from infclip.pipeline.train.run_state import RunState

    state = RunState()
    loaders: list = []

    def tracked(epoch, start):
        loader = build(epoch, start)
        loaders.append(loader)
        return loader

    tcfg = run_cfg.train
    log = TrainLogger(None, total_steps=warmup + steps, start_step=0, micro_batch=run_cfg.micro_batch_size,
                      workers=run_cfg.data.workers)
    decode_ms: list = []
    stall_ms: list = []
    waits = [0.0]
    micro = log.micro_step

    def watched(**kw):  # the logger's window restarts at log steps: keep the phase's own totals
        if kw.get("decode_ms") is not None:
            decode_ms.append(kw["decode_ms"])
        if kw.get("stall_ms") is not None:
            stall_ms.append(kw["stall_ms"])
        waits[0] += kw["data_s"]
        micro(**kw)

    log.micro_step = watched
    loop = TrainLoop(te, Batches(tracked, state, None), state, tcfg, log, EvalSchedule(None, log), checkpoints=None)
    loop.guard.lead = lead
    guard_s = [0.0]
    check = loop.guard._check

    def timed_check(entry):  # the training thread waiting for the GPU: the loss one micro-step back
        t = time.perf_counter()
        check(entry)
        guard_s[0] += time.perf_counter() - t

    loop.guard._check = timed_check
    tcfg.steps = warmup
    loop.run()
    torch.cuda.synchronize()
    reniced = renice_decode_threads(nice) if nice is not None else 0
    tcfg.steps = warmup + steps
    waits0, decoded0, stalled0, guard0 = waits[0], len(decode_ms), len(stall_ms), guard_s[0]
    clocks, gil, gcs = GpuClocks(torch.cuda.current_device()), GilProbe(), GcWatch()
    if not collect:
        gc.disable()
    h0 = _host_now()
    t0 = time.perf_counter()
    loop.run()
    torch.cuda.synchronize()
    elapsed = time.perf_counter() - t0
    guard_wait = guard_s[0] - guard0
    if not collect:
        gc.enable()
    gpu_clocks, gil_waits, collections = clocks.stop(), gil.stop(), gcs.stop()  # before h1: neither is counted among the threads and children
    h1 = _host_now()
    timed, stalled = decode_ms[decoded0:], stall_ms[stalled0:]  # the timed steps' batches, not the profiled ones
    stage = getattr(loaders[-1], "stage", None) if loaders else None
    host = dict(stage.host_s) if stage is not None else None
    timeline = None
    if profile:
        from torch.profiler import ProfilerActivity
        from torch.profiler import profile as torch_profile

        tcfg.steps = warmup + steps + profile
        with torch_profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
            loop.run()
            torch.cuda.synchronize()
        path = os.path.join(tempfile.mkdtemp(prefix="bench_stream_trace_"), "trace.json")
        prof.export_chrome_trace(path)
        timeline = gpu_timeline(path, profile, threading.get_native_id(), _decode_threads())
    threads = None
    if sampled:
        tcfg.steps += sampled
        sampler = ThreadSamples(sample_rate, sample_native)
        loop.run()
        torch.cuda.synchronize()
        threads = sampler.stop()
        if sample_path and os.path.exists(sampler.path):
            shutil.copy(sampler.path, sample_path)
    loop.batches.close()  # the phase's loader workers and decode threads end here, not at exit
    samples = steps * run_cfg.micro_batch_size * te.engine.gradient_accumulation_steps() * te.dp_world
    return {"samples_per_s": samples / elapsed, "step_ms": 1e3 * elapsed / steps,
            "wait_fraction": (waits[0] - waits0) / elapsed,
            "gpu_decode_ms": sum(float(t) for t in timed) / len(timed) if timed else None,
            # the GPU time the step's stream stood still for batches not yet decoded, over the wall time
            "gpu_stall_fraction": sum(float(t) for t in stalled) / 1e3 / elapsed if stalled else None,
            # the decode thread over the whole phase (warm-up included): per batch, its wait for the
            # previous batch's GPU work and its own host time
            "decode_wait_ms": 1e3 * host["waiting"] / max(host["batches"], 1) if host else None,
            "decode_host_ms": 1e3 * host["queueing"] / max(host["batches"], 1) if host else None,
            "decode_in_nvjpeg_ms": 1e3 * host["in_nvjpeg"] / max(host["batches"], 1) if host else None,
            # the training thread: its CPU time a step, how often per step it was runnable but descheduled,
            # and the process's threads and child processes while the phase ran
            "main_cpu_ms": 1e3 * (h1["cpu_s"] - h0["cpu_s"]) / steps,
            "main_preempted": (h1["switches"] - h0["switches"]) / steps,
            # the training thread blocking a step (any wait: a lock, the GPU, a batch), and its wait for the
            # GPU to finish the micro-step before last (near 0: the host, not the GPU, sets the pace)
            "main_blocked": (h1["voluntary"] - h0["voluntary"]) / steps,
            "main_gpu_wait_ms": 1e3 * guard_wait / steps,
            **_host_shares(h0, h1),
            # the decode stage's threads (lanes, feeder) together, a step: CPU time and times descheduled
            "decode_cpu_ms": 1e3 * (h1["decode_cpu_s"] - h0["decode_cpu_s"]) / steps,
            "decode_preempted": (h1["decode_switches"] - h0["decode_switches"]) / steps,
            "threads": h1["threads"], "children": h1["children"],
            "decode_nice": nice, "decode_threads_reniced": reniced,
            # the GPU while the timed steps ran (nvidia-smi every 200 ms): SM clock, power, clock-event reasons
            **gpu_clocks,
            # how late a 1 ms sleep in another thread returned (mean, 99th percentile): the interpreter lock's wait
            **gil_waits,
            # the garbage collections: per generation [count, total ms, longest ms]
            **collections, "gc_enabled": collect,
            **({"profile": timeline} if timeline else {}),
            **({"thread_samples": threads} if threads else {})}


def _loop_flags(decode: str) -> tuple:
    """A phase's decode spec without the flags that set the training loop rather than the loader:
    ``(decode, lead, collect)`` from ``+leadN`` (the host N micro-steps ahead; default 1) and
    ``+nogc`` (automatic garbage collection off while the timed steps run)."""
    first, *flags = decode.split("+")
    lead, collect, rest = 1, True, []
    for flag in flags:
        if flag == "nogc":
            collect = False
        elif flag.startswith("lead") and flag[4:].isdigit():
            lead = int(flag[4:])
        else:
            rest.append(flag)
    return "+".join([first, *rest]), lead, collect


def write_anchored(rows: list, written: int, out: str, final: bool = False) -> int:
    """Append to ``out`` the rows from ``written`` on whose phases on either side have run (all of
    them when ``final``), each with its anchor, the mean of the synthetic phases beside it (the GPU's
    clock drifts over a call: heat, power cap), and its ratio to that; the count written. Written as
    they complete, so a call cut short keeps its finished phases."""
    end = len(rows) if final else len(rows) - 1
    os.makedirs(os.path.dirname(out) or ".", exist_ok=True)
    with open(out, "a") as f:
        for i in range(written, end):
            row = rows[i]
            near = [r["samples_per_s"] for r in rows[max(i - 1, 0):i + 2] if r["phase"] == "synthetic" and r is not row]
            row["anchor_samples_per_s"] = sum(near) / len(near) if near else row["samples_per_s"]
            row["ratio"] = row["samples_per_s"] / row["anchor_samples_per_s"]
            f.write(json.dumps(row) + "\n")
    return max(end, written)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--preset", default="ds_configs/vitb32.json")
    p.add_argument("--micro_batch", type=int, default=None, help="default: the preset's")
    p.add_argument("--workers", type=int, default=None, help="data.workers (default: the preset's)")
    p.add_argument("--sets", nargs="+", default=["web256:gpu", "web512:gpu", "web256:cpu"],
                   help="image_set:decode phases (web256, web512, web256mixed, web512as256, scenes224; cpu or gpu[/DECODER][@SHARE][%%PIXELS][#HOSTSHARE][&ENGINESHARE][*LANES]"
                        "[^PRIORITY][~WORKERS][+interleaved][+batchcopy][+pad][+core][+keepoff][+band][+scaled][+fullsize][!NICE]: data.gpu_decoder nvjpeg or torchvision, data.gpu_decode_share SHARE, "
                        "data.gpu_decode_host_max_pixels PIXELS, data.gpu_decode_host_share HOSTSHARE, data.gpu_decode_engine_share ENGINESHARE, "
                        "data.gpu_decode_lanes LANES, data.gpu_decode_priority high or normal, data.workers WORKERS, "
                        "data.gpu_decode_host_interleaved true, data.gpu_decode_host_copy batch; +pad: nvJPEG's allocations padded by "
                        "16 MiB (device) and 8 MiB (pinned host); +core: data.reserve_training_core true; +keepoff: the same without moving the training thread (only the loader kept off its core); +band: the crop kernel that filters a band of rows axis by axis (image_ops.KERNEL band); +scaled / +fullsize: data.gpu_decode_scaled true / false (JPEGs whose crop allows it decoded in the DCT domain at a reduced scale, or every JPEG by nvJPEG at full size); +leadN: the host runs N micro-steps ahead of the GPU instead of 1; +nogc: the interpreter's automatic garbage collection off while the timed steps run; !NICE: the decode threads at that scheduling "
                        "niceness, e.g. !10, so the training thread wins a contested core)")
    p.add_argument("--crop_scale", type=float, nargs=2, default=[0.9, 1.0],
                   help="random resized crop area range for the web sets (the data section's default)")
    p.add_argument("--shards", type=int, default=32)
    p.add_argument("--per_shard", type=int, default=500)
    p.add_argument("--warmup", type=int, default=15)
    p.add_argument("--steps", type=int, default=40)
    p.add_argument("--switch_intervals", type=float, nargs="+", default=[None],
                   help="run the streamed phases once per interpreter switch interval (sys.setswitchinterval, s)")
    p.add_argument("--set", dest="overrides", action="append", default=[], metavar="KEY=VALUE",
                   help="a config override on top of the preset, as launch/pretrain.py's --set (repeatable)")
    p.add_argument("--profile", type=int, default=0, metavar="N",
                   help="after each phase, N more steps under torch.profiler: per step, each CUDA stream's kernels "
                        "and copies, the time any kernel ran and the host's CUDA calls (printed and in the rows)")
    p.add_argument("--sample_threads", type=int, default=0, metavar="N",
                   help="after each phase, N more steps with every thread's stack sampled by py-spy (when "
                        "installed): the share of each thread's time waiting for the interpreter lock, the GPU, "
                        "the CUDA driver or work (thread_samples in the rows)")
    p.add_argument("--sample_dir", default=None, help="keep each phase's raw py-spy samples here")
    p.add_argument("--sample_rate", type=int, default=100, help="py-spy samples a second")
    p.add_argument("--sample_python", action="store_true",
                   help="sample Python frames only: py-spy starts at once and disturbs the step less, and each "
                        "thread's time is named by the Python function it is in (the rows' classes then read "
                        "native waits as running)")
    p.add_argument("--host_work", choices=["current", "per_tensor"], default="current",
                   help="per_tensor: flat parameters' views bound anew every forward and DeepSpeed's gradient norm "
                        "one tensor at a time, to measure what the default saves the host "
                        "(pipeline.model.flat_params.REUSE_VIEWS, pipeline.engine.zero_step.ONE_CALL_NORM)")
    p.add_argument("--sm_carveout", type=int, default=None, metavar="N",
                   help="every phase's matrix products through cuBLASLt, told to leave N SMs free "
                        "(torch._C._set_sm_carveout_experimental), set before the model is built")
    p.add_argument("--dir", default=None, help="where the image sets are written (kept for reuse)")
    p.add_argument("--out", default=os.path.join(ROOT, "bench", "results", "stream.jsonl"))
    args = p.parse_args(argv)
    if args.sm_carveout is not None:
        carve_sms(args.sm_carveout)
    if args.sample_dir:
        os.makedirs(args.sample_dir, exist_ok=True)
    from infclip.pipeline.data import image_ops, nvjpeg
    from infclip.pipeline.data.build import build_train_loader
    from infclip.pipeline.data import cores
    from infclip.pipeline.data.cores import physical_cores
    from infclip.pipeline.data.tokenizer import iter_shard_captions, train_bpe_tokenizer
    from infclip.pipeline.engine.dist import init_distributed, single_process_env
    from infclip.pipeline.engine.engine import build_engine

    if args.host_work == "per_tensor":
        from infclip.pipeline.engine import zero_step
        from infclip.pipeline.model import flat_params

        flat_params.REUSE_VIEWS = zero_step.ONE_CALL_NORM = False
    single_process_env()
    work = args.dir or tempfile.mkdtemp(prefix="bench_stream_")
    sets = {name: image_set(work, name, args.shards, args.per_shard)
            for name in dict.fromkeys(s.split(":")[0] for s in args.sets)}
    first = next(iter(sets.values()))
    overrides = ["train.save_every=0", "train.save_final=false", "train.export_final=false", "train.collapse_window=0",
                 f"train.output_dir={work}/run", "data.resampled=true", "data.samples_per_epoch=1000000000",
                 f"data.train_shards={json.dumps(first)}"]
    if args.micro_batch:
        overrides.append(f"train_micro_batch_size_per_gpu={args.micro_batch}")
    if args.workers is not None:
        overrides.append(f"data.workers={args.workers}")
    run_cfg = load_config(os.path.join(ROOT, args.preset), overrides + args.overrides)
    init_distributed()
    tokenizer = train_bpe_tokenizer(iter_shard_captions(first, max_captions=20000), os.path.join(work, "tok"),
                                    vocab_size=min(run_cfg.data.vocab_size, 4096))
    te = build_engine(run_cfg, tokenizer)

    default_share, default_lanes = run_cfg.data.gpu_decode_share, run_cfg.data.gpu_decode_lanes
    default_priority, default_host = run_cfg.data.gpu_decode_priority, run_cfg.data.gpu_decode_host_max_pixels
    default_interleaved, default_copy = run_cfg.data.gpu_decode_host_interleaved, run_cfg.data.gpu_decode_host_copy
    default_host_share, default_workers = run_cfg.data.gpu_decode_host_share, run_cfg.data.workers
    default_padding, default_core = nvjpeg.MEMORY_PADDING, run_cfg.data.reserve_training_core
    default_kernel = image_ops.KERNEL
    default_engines = run_cfg.data.gpu_decode_engine_share
    default_scaled = run_cfg.data.gpu_decode_scaled

    def loader(urls, decode, crop):
        cfg = run_cfg.data
        decode, *flags = decode.split("+")  # gpu+interleaved+batchcopy: the host decoder's layout and copy
        unknown = set(flags) - {"interleaved", "batchcopy", "pad", "core", "keepoff", "band", "scaled", "fullsize"}
        if unknown:
            raise SystemExit(f"unknown phase flag(s) {sorted(unknown)}: +interleaved, +batchcopy, +pad, +core, +keepoff, "
                             "+band, +scaled, +fullsize, +nogc or +leadN")
        cfg.gpu_decode_scaled = "scaled" in flags or ("fullsize" not in flags and default_scaled)
        image_ops.KERNEL = "band" if "band" in flags else default_kernel
        cfg.reserve_training_core = "core" in flags or "keepoff" in flags or default_core
        cores.PIN_TRAINING_THREAD = "keepoff" not in flags
        nvjpeg.MEMORY_PADDING = PADDING if "pad" in flags else default_padding
        cfg.gpu_decode_host_interleaved = "interleaved" in flags or default_interleaved
        cfg.gpu_decode_host_copy = "batch" if "batchcopy" in flags else default_copy
        decode, _, workers = decode.partition("~")  # gpu@0.5~14: data.workers 14 for this phase
        cfg.workers = int(workers) if workers else default_workers
        decode, _, priority = decode.partition("^")  # gpu^normal: data.gpu_decode_priority normal
        cfg.gpu_decode_priority = priority or default_priority
        decode, _, lanes = decode.partition("*")  # gpu*1: data.gpu_decode_lanes 1
        cfg.gpu_decode_lanes = int(lanes) if lanes else default_lanes
        decode, _, engines = decode.partition("&")  # gpu&0.5: data.gpu_decode_engine_share 0.5
        cfg.gpu_decode_engine_share = float(engines) if engines else default_engines
        decode, _, host_share = decode.partition("#")  # gpu%300000#0.4: data.gpu_decode_host_share 0.4
        cfg.gpu_decode_host_share = float(host_share) if host_share else default_host_share
        decode, _, host = decode.partition("%")  # gpu%70000: data.gpu_decode_host_max_pixels 70000
        cfg.gpu_decode_host_max_pixels = int(host) if host else default_host
        decode, _, share = decode.partition("@")  # gpu@0.5: data.gpu_decode_share 0.5
        decode, _, decoder = decode.partition("/")  # gpu/torchvision: data.gpu_decoder
        cfg.decode, cfg.crop_scale, cfg.gpu_decoder = decode, list(crop), decoder or "auto"
        cfg.gpu_decode_share = float(share) if share else default_share
        return lambda epoch, start: build_train_loader(
            cfg, tokenizer, image_size=te.image_size, context_length=te.context_length,
            batch_size=run_cfg.micro_batch_size, epoch=epoch, start_batch=start, shards=urls, device=te.device,
            dtype=te.input_dtype)

    one = next(iter(loader(first, "cpu", args.crop_scale)(0, 0)))
    synthetic = _Synthetic({k: v for k, v in one.items() if k in ("pixel_values", "input_ids", "attention_mask")})
    base = {"bench": "stream", "time": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
            "preset": args.preset, "overrides": args.overrides, "micro_batch": run_cfg.micro_batch_size,
            "workers": run_cfg.data.workers,
            "cpu_count": os.cpu_count(), "physical_cores": len(physical_cores(os.sched_getaffinity(0))),
            "device": torch.cuda.get_device_name(), "steps": args.steps, "host_work": args.host_work,
            # the GPU's hardware work queues the process's streams share (CUDA's default: 8)
            "cuda_device_max_connections": os.environ.get("CUDA_DEVICE_MAX_CONNECTIONS"),
            "sm_carveout": args.sm_carveout}
    streamed = [(s, i) for i in args.switch_intervals for s in args.sets]
    phases = ["synthetic"] + [p for s in streamed for p in (s, "synthetic")]  # each streamed phase between two anchors
    rows, written = [], 0
    default_interval = sys.getswitchinterval()
    for phase in phases:
        phase, interval = phase if isinstance(phase, tuple) else (phase, None)
        sys.setswitchinterval(interval or default_interval)
        nice, lead, collect = "", 1, True
        if phase == "synthetic":
            build = lambda epoch, start: synthetic  # noqa: E731
        else:
            name, decode = phase.split(":")
            decode, _, nice = decode.partition("!")  # gpu!10: the decode threads at niceness 10
            decode, lead, collect = _loop_flags(decode)
            crop = [1.0, 1.0] if name.startswith("scenes") else args.crop_scale
            build = loader(sets[name], decode, crop)
        gpu = ":gpu" in phase
        row = {**base, "phase": phase,
               "workers": base["workers"] if phase == "synthetic" else run_cfg.data.workers,
               "gpu_decode_share": run_cfg.data.gpu_decode_share if gpu else None,
               "gpu_decoder": run_cfg.data.gpu_decoder if gpu else None,
               "gpu_decode_scaled": run_cfg.data.gpu_decode_scaled if gpu else None,
               "gpu_decode_lanes": run_cfg.data.gpu_decode_lanes if gpu else None,
               "gpu_decode_priority": run_cfg.data.gpu_decode_priority if gpu else None,
               "gpu_decode_host_max_pixels": run_cfg.data.gpu_decode_host_max_pixels if gpu else None,
               "gpu_decode_host_interleaved": run_cfg.data.gpu_decode_host_interleaved if gpu else None,
               "gpu_decode_host_copy": run_cfg.data.gpu_decode_host_copy if gpu else None,
               "gpu_decode_host_share": run_cfg.data.gpu_decode_host_share if gpu else None,
               "nvjpeg_memory_padding": list(nvjpeg.MEMORY_PADDING) if gpu else None,
               "crop_kernel": image_ops.KERNEL if gpu else None,
               "reserve_training_core": run_cfg.data.reserve_training_core if phase != "synthetic" else None,
               "pin_training_thread": cores.PIN_TRAINING_THREAD if phase != "synthetic" else None,
               "switch_interval": sys.getswitchinterval(), "host_lead": lead,
               **run_phase(te, run_cfg, build, args.warmup, args.steps, args.profile, int(nice) if nice else None,
                           args.sample_threads, lead, collect,
                           os.path.join(args.sample_dir, f"{len(rows):02d}_{phase.replace(':', '_')}.txt")
                           if args.sample_dir else None, args.sample_rate, not args.sample_python)}
        rows.append(row)
        print(f"{phase:>14} (switch {1e3 * row['switch_interval']:.2g} ms): {row['samples_per_s']:8.0f} samples/s, "
              f"step {row['step_ms']:6.1f} ms (training thread's CPU {row['main_cpu_ms']:.1f} ms, descheduled "
              f"{row['main_preempted']:.1f}x a step; {row['threads']} threads, {row['children']} child processes), "
              f"waiting {row['wait_fraction']:.1%}"
              + (f" (+ {row['gpu_stall_fraction']:.1%} on the GPU)" if row["gpu_stall_fraction"] is not None else "")
              + (f", interpreter lock wait {row['gil_late_ms']:.2f} ms (p99 {row['gil_late_p99_ms']:.2f})"
                 if "gil_late_ms" in row else "")
              + (f", SM clock {row['sm_clock_mhz']:.0f} MHz (min {row['sm_clock_min_mhz']:.0f}, "
                 f"{row['power_w']:.0f} W, events {row['clock_event_reasons']})" if "sm_clock_mhz" in row else "")
              + (f", decode {row['gpu_decode_ms']:.1f} ms a batch on the GPU, thread waits "
                 f"{row['decode_wait_ms']:.1f} ms + queues {row['decode_host_ms']:.1f} ms "
                 f"({row['decode_in_nvjpeg_ms']:.1f} in the nvJPEG call); decode threads' CPU "
                 f"{row['decode_cpu_ms']:.1f} ms, descheduled {row['decode_preempted']:.1f}x a step"
                 if row["gpu_decode_ms"] else ""),
              flush=True)
        print(f"{'':>14}  training thread a step: blocked {row['main_blocked']:.0f}x, waiting for the GPU "
              f"{row['main_gpu_wait_ms']:.1f} ms; host cores busy {row['host_busy']:.0%}, stolen {row['host_steal']:.1%}; "
              f"garbage collections [count, ms, longest ms] gen0 {row['gc0']} gen1 {row['gc1']} gen2 {row['gc2']}, "
              f"{row['gc_other_threads_ms']} ms in other threads", flush=True)
        if "profile" in row:
            print(f"{'':>14}  per step under the profiler: {json.dumps(row['profile'])}", flush=True)
        if "thread_samples" in row:
            print(f"{'':>14}  threads sampled: {json.dumps(row['thread_samples'])}", flush=True)
        written = write_anchored(rows, written, args.out)
    write_anchored(rows, written, args.out, final=True)
    for row in rows:
        if row["phase"] != "synthetic":
            print(f"{row['phase']:>14}: {row['ratio']:.1%} of the synthetic step on either side "
                  f"({row['anchor_samples_per_s']:.0f} samples/s)", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
