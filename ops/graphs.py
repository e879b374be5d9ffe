"""CUDA-graph replay of the single-device loss at small B. One role: capture a call of the op's
forward or backward once per shape and options, then replay it.

Why: below B ~ 16k a call of the op is bound by its host, not the GPU. On an idle H200 (bf16,
D = 768) a CLIP forward + backward at B = 1,024 took 1.82 ms, of which the GPU worked 0.08 ms
(the same calls replayed as one graph): the rest is Python, the
dispatcher and ~8 kernel launches. A replay is one launch, whatever the number of kernels.

How: :class:`GraphedCall` keeps static copies of the call's tensor inputs, runs the call once
eagerly on the caller's stream (Triton compiles, cuBLAS sets up), captures it, and on each later
call copies the new inputs into the static ones, replays, and returns copies of the static outputs
(one multi-tensor copy per dtype each way). The outputs are copies because the op's outputs are
saved for its backward, which may come after another forward: a replay must not overwrite them.
:class:`GraphCache` holds the last few captures by key (shapes, strides, dtypes, device, every
option) and remembers the keys that cannot be captured (they run eagerly).

Memory: the captures of a cache on one device share one private memory pool (that of a graph it
holds), and each warms up on the caller's stream. A graph's intermediates are dead once its
replay ends and its static outputs are copied out right after it, so captures can reuse each
other's blocks as long as their replays do not overlap on the GPU: the cache orders each replay
after the previous one (a wait on the previous replay's stream when the caller's stream is
another). A pool per capture, warmed up on a new side stream, would cost more: torch keeps a
cuBLAS workspace per stream for the life of the process, and on an H200 every new shape (also
each recapture after an eviction) kept ~70 MiB more that way.

When: the callers (ops/registered.py) replay only up to ``graph_max_batch`` rows (16,384 by
default, 0: never), only the single-device scheme (collectives stay eager), only on CUDA, only
outside another capture (inside one, the call is part of the outer graph), and only when nothing is
queued on the stream (or for the backward of a replayed forward). Behind queued work (the towers'
forward, in training) the eager launches hide anyway, and the replay's copies cost GPU time: on an
H200 at B = 1,024, 0.10 ms a forward + backward replayed against 0.05 eager, both behind 20 ms of
queued work.

The replayed kernels are the eager call's, launched with the same arguments: the same values,
except for the last bits of the fp32 atomic sums (their order varies from run to run, eager or
not).
"""

from __future__ import annotations

import collections
import warnings
from typing import Callable, Optional, Sequence

import torch
from torch import Tensor

__all__ = ["GraphCache", "GraphedCall", "tensor_key"]


def tensor_key(tensors: Sequence[Optional[Tensor]]) -> tuple:
    """What a capture depends on in its tensor inputs (None stays None)."""
    return tuple(None if t is None else (tuple(t.shape), t.stride(), t.dtype, t.device)
                 for t in tensors)


def _static_like(t: Optional[Tensor]) -> Optional[Tensor]:
    if t is None:
        return None
    return torch.empty_strided(t.shape, t.stride(), dtype=t.dtype, device=t.device).copy_(t)


class GraphedCall:
    """``run(*tensors)`` (a tuple of tensors out) captured as a CUDA graph on static copies of
    ``tensors``, its memory from ``pool`` (a graph's pool id; None: a pool of its own); calling
    it with new tensors of the same shapes replays it."""

    def __init__(self, run: Callable[..., tuple], tensors: Sequence[Optional[Tensor]],
                 pool: Optional[tuple] = None) -> None:
        self.inputs = [_static_like(t) for t in tensors]
        self.device = next(t.device for t in tensors if t is not None)
        run(*self.inputs)  # the warm-up, on the caller's stream: kernels compiled, handles made
        self.graph = torch.cuda.CUDAGraph()
        # thread_local: other threads (a data loader pinning memory) may use CUDA meanwhile
        with torch.cuda.graph(self.graph, pool=pool, capture_error_mode="thread_local"):
            self.outputs = run(*self.inputs)
        self.input_groups = _by_dtype(self.inputs)
        self.output_groups = _by_dtype(self.outputs)
        self.replays = 0

    def __call__(self, tensors: Sequence[Optional[Tensor]]) -> tuple:
        for index, static in self.input_groups:
            torch._foreach_copy_(static, [tensors[i] for i in index])
        self.graph.replay()
        self.replays += 1
        out = [torch.empty_like(o) for o in self.outputs]
        for index, static in self.output_groups:
            torch._foreach_copy_([out[i] for i in index], static)
        return tuple(out)


def _end_rng_capture(device: torch.device) -> None:
    """After a capture that failed: torch marks the device's default generator as being captured
    when a capture begins and unmarks it only when one ends well, so until then every random
    draw on that device raises ("Offset increment outside graph capture"). An empty capture on
    the device begins and ends well, which unmarks it."""
    try:
        with torch.cuda.device(device), warnings.catch_warnings():
            warnings.simplefilter("ignore")  # torch warns that the graph is empty
            with torch.cuda.graph(torch.cuda.CUDAGraph()):
                pass
    except RuntimeError:  # no worse than before: the call still runs eagerly
        pass


def _by_dtype(tensors: Sequence[Optional[Tensor]]) -> list:
    """(positions, tensors) per dtype of the non-empty tensors: one multi-tensor copy launch each
    (rather than one per tensor: ~10 small copies a call)."""
    groups: dict = {}
    for i, t in enumerate(tensors):
        if t is not None and t.numel():
            groups.setdefault(t.dtype, ([], []))
            groups[t.dtype][0].append(i)
            groups[t.dtype][1].append(t)
    return list(groups.values())


class GraphCache:
    """The last ``size`` captures by key; ``call`` replays one, captures it first, or runs
    ``run`` eagerly where the capture failed for that key once. The captures on a device share
    one memory pool; their replays run one after another on the GPU (module docstring)."""

    def __init__(self, size: int = 8) -> None:
        self.size = size
        self.calls: collections.OrderedDict = collections.OrderedDict()
        self.last_stream: dict = {}  # device -> the stream of its last replay

    def _pool(self, device: torch.device) -> Optional[tuple]:
        """The pool of a graph held for ``device`` (None: none held, the next capture makes one;
        a pool whose graphs are all gone is freed and cannot be reused)."""
        return next((e.graph.pool() for e in self.calls.values() if e is not None and e.device == device),
                    None)

    def call(self, key: tuple, run: Callable[..., tuple], tensors: Sequence[Optional[Tensor]]
             ) -> tuple:
        entry = self.calls.get(key)
        if entry is None and key not in self.calls:
            device = next(t.device for t in tensors if t is not None)
            try:
                entry = GraphedCall(run, tensors, self._pool(device))
            except RuntimeError:  # not capturable (a host sync in the call): eager from now on
                _end_rng_capture(device)
                entry = None
            self.calls[key] = entry
            while len(self.calls) > self.size:
                self.calls.popitem(last=False)
        else:
            self.calls.move_to_end(key)
        if entry is None:
            return run(*tensors)
        current = torch.cuda.current_stream(entry.device)
        last = self.last_stream.get(entry.device)
        if last is not None and last != current:  # the shared pool: after the last replay
            current.wait_stream(last)
        self.last_stream[entry.device] = current
        return entry(tensors)

    def clear(self) -> None:
        self.calls.clear()
