"""Where each thread of this process spends its wall time, sampled by py-spy from outside the interpreter.

Design: a thread that holds no CPU in ``/proc`` may be waiting for the interpreter lock, for the
GPU, for the CUDA driver or for work; only its native stack says which. :class:`ThreadSamples` runs
``py-spy record --native --idle --threads`` on this process (py-spy pauses it briefly for each
sample, so sampled steps are not timed ones) and :func:`classify` sorts each thread's samples by
the innermost frames:

- ``gil``: waiting for the interpreter lock (``pthread_cond_timedwait`` under the lock's take:
  ``gil_scoped_acquire``, ``~gil_scoped_release``, ``PyEval_RestoreThread`` and the like, or right
  under the interpreter), or handing it over (torch's ``gil_scoped_*`` signalling the next holder);
- ``gpu_wait``: a CUDA event, stream or device synchronisation;
- ``cuda``: inside the CUDA driver or runtime otherwise (launches, copies, the driver's own locks);
- ``idle``: blocked waiting for work (a queue, a sleep, a poll, a read);
- ``cpu``: anything else (running Python or native code).

Nothing is sampled where ``py-spy`` is not installed (``pip install py-spy``).
"""

from __future__ import annotations

import ctypes
import os
import re
import shutil
import signal
import subprocess
import tempfile
from collections import Counter, defaultdict
from typing import Dict, Iterable, Optional

__all__ = ["ThreadSamples", "classify", "thread_group"]

_GIL_TAKERS = ("gil_scoped_acquire", "~gil_scoped_release", "PyEval_RestoreThread", "PyEval_AcquireThread",
               "PyGILState_Ensure", "take_gil", "PyEval_AcquireLock", "_PyEval_EvalFrameDefault",
               "_PyEval_EvalFrame", "PyObject_Vectorcall", "_PyObject_MakeTpCall")
_GPU_WAITS = ("EventSynchronize", "StreamSynchronize", "DeviceSynchronize", "cuCtxSynchronize")
_IDLE_LEAVES = ("pthread_cond_wait", "sem_wait", "sem_timedwait", "sem_clockwait", "epoll_wait", "poll", "select",
                "nanosleep", "clock_nanosleep", "usleep", "sleep", "read", "recv", "recvmsg", "accept",
                "futex_wait", "do_futex_wait", "__futex_abstimed_wait_common", "pthread_cond_clockwait",
                "PyThread_acquire_lock_timed", "lock_PyThread_acquire_lock", "time_sleep", "select_poll_poll_impl")
_FRAME = re.compile(r"^(.*?)(?: \(([^()]*)\))?$")
_CUDA_CALL = re.compile(r"^cu(da)?[A-Z]")


def _name(frame: str) -> str:
    """A raw frame ``function (file:line)`` or ``function (library.so)`` -> the function."""
    return _FRAME.match(frame.strip()).group(1).strip()


def _where(frame: str) -> str:
    """A raw frame -> where it is: the library or executable of a native frame, ``""`` for a Python one."""
    where = _FRAME.match(frame.strip()).group(2) or ""
    return "" if ".py:" in where or "<frozen" in where else where


def classify(frames: Iterable[str]) -> str:
    """One sample's stack, outermost first -> ``gil``, ``gpu_wait``, ``cuda``, ``idle`` or ``cpu``."""
    frames = list(frames)
    names = [_name(f) for f in frames]
    if any(any(w in n for w in _GPU_WAITS) for n in names):
        return "gpu_wait"
    for i in range(len(names) - 1, -1, -1):  # innermost first: the lock's wait is a timed one on a condition
        if names[i] == "pthread_cond_timedwait":
            callers = range(max(i - 3, 0), i)
            if any(any(t in names[k] for t in _GIL_TAKERS) or "python" in _where(frames[k]) for k in callers):
                return "gil"
            break
    if any("gil_scoped" in n for n in names[-3:]):  # the lock handed over: signalling its condition, its mutex
        return "gil"
    if any("libcuda" in _where(f) or _CUDA_CALL.match(n) for f, n in zip(frames, names)):
        return "cuda"
    if any(n in _IDLE_LEAVES for n in names[-4:]):
        return "idle"
    return "cpu"


def thread_group(name: str) -> str:
    """A thread's name -> its role in the training process: ``training`` (the main thread), ``decode``
    (a decode lane), ``feed`` (the lanes' feeder, which reads the DataLoader), ``pin`` (the DataLoader's
    pin-memory thread), ``probe`` (the bench's own samplers) or ``other``."""
    if name == "MainThread":
        return "training"
    if name.startswith("infclip-decode-feed"):
        return "feed"
    if name.startswith("infclip-decode-"):
        return "decode"
    if "pin_memory" in name:
        return "pin"
    if name.startswith("bench-"):
        return "probe"
    return "other"


def summarize(raw_lines: Iterable[str]) -> Dict[str, dict]:
    """py-spy's raw output (``thread (TID): NAME;frame;...;frame COUNT`` a line) -> per thread role:
    ``samples`` and the share of each class (:func:`classify`), and for the training thread its
    most sampled innermost frames."""
    counts: Dict[str, Counter] = defaultdict(Counter)
    leaves: Counter = Counter()
    for line in raw_lines:
        line = line.rstrip("\n")
        stack, _, n = line.rpartition(" ")
        if not stack or not n.isdigit():
            continue
        parts = stack.split(";")
        head = re.match(r"thread \((?:0x)?[0-9a-fA-F]+\): ?(.*)", parts[0])
        if head is None:
            continue
        role = thread_group(head.group(1).strip())
        kind = classify(parts[1:])
        counts[role][kind] += int(n)
        if role == "training":  # the innermost frames, and the innermost Python frame: who called them
            python = next((_name(f) for f in reversed(parts[1:]) if ".py:" in f), "")
            leaves[f"{kind}: " + " < ".join(_name(f) for f in reversed(parts[-3:])) + f" [{python}]"] += int(n)
    out: Dict[str, dict] = {}
    for role, c in counts.items():
        total = sum(c.values())
        out[role] = {"samples": total, **{k: round(v / total, 4) for k, v in sorted(c.items())}}
    if leaves:
        total = sum(leaves.values())
        out.setdefault("training", {})["top"] = [[k, round(v / total, 4)] for k, v in leaves.most_common(12)]
    return out


class ThreadSamples:
    """py-spy sampling this process at ``rate`` a second from construction to :meth:`stop`; with
    ``native`` False, Python frames only (py-spy starts at once and pauses the process for less,
    but a thread waiting in native code shows as its innermost Python call)."""

    def __init__(self, rate: int = 100, native: bool = True) -> None:
        exe = shutil.which("py-spy")
        self.proc: Optional[subprocess.Popen] = None
        self.path = os.path.join(tempfile.mkdtemp(prefix="thread_samples_"), "raw.txt")
        if exe is None:
            return
        try:  # a child may read its parent's memory where Yama restricts ptrace to descendants
            ctypes.CDLL(None).prctl(0x59616D61, ctypes.c_ulong(-1 & 0xFFFFFFFFFFFFFFFF), 0, 0, 0)  # PR_SET_PTRACER_ANY
        except (OSError, AttributeError):
            pass
        self.proc = subprocess.Popen([exe, "record", "--pid", str(os.getpid()), *(["--native"] if native else []),
                                      "--idle", "--threads", "--rate", str(rate), "--format", "raw", "--output",
                                      self.path],
                                     stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)

    def stop(self) -> dict:
        """Stop sampling; :func:`summarize` of what was recorded (``{"error": ...}`` when py-spy failed)."""
        if self.proc is None:
            return {}
        self.proc.send_signal(signal.SIGINT)  # py-spy writes its output on an interrupt, as on Ctrl+C
        try:
            _, err = self.proc.communicate(timeout=60)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            _, err = self.proc.communicate()
        if not os.path.exists(self.path):
            return {"error": (err or "").strip().splitlines()[-1:] or ["no output"]}
        with open(self.path) as f:
            return summarize(f)
