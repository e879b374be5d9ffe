"""Launches of a jitted Triton or Gluon kernel that skip Triton's per-launch binding. One role:
after a first launch through ``kernel[grid](...)``, later launches whose arguments would
specialise the kernel the same way call the compiled kernel's launcher directly.

Why: the backward of the CLIP loss (and SigLIP's forward) launches one fused kernel per gradient
block, 64 a call at B = 32,768, and on an idle GPU the call's host time paces it. Of a Gluon
block's ~50-72 us of host time on an H200's host, Triton's binding of the arguments and its cache
lookup took 21-28 us and the launcher itself 14-21 (bench/diag_launch_host.py, h200_ez).

How: :func:`launch` keys each launch by what Triton specialises on, taken more finely than Triton
does: integers and constexprs by value, tensors (pointers) by dtype, device and 16-byte alignment,
tensor descriptors by dtype, shape, strides, block shape, layout and base alignment, floats by
type alone (Triton does not specialise them). The first launch of a key goes through
``kernel[grid](...)``, which compiles or finds the kernel and returns it; later launches of that
key hand the same argument list to its launcher. A finer key than Triton's can only cost a
normal launch more, never a wrong kernel. Launch hooks (a profiler's) or a Triton whose compiled
kernels lack the launcher's attributes (the interpreter) keep the normal path throughout; a
launcher that refuses the call (another Triton's signature) turns the fast path off for good.
"""

from __future__ import annotations

import logging
from typing import Any

import torch

__all__ = ["launch", "launch_key", "FAST"]

FAST = {"on": True, "launches": 0}
"""``on``: the fast path is allowed (False: every launch through Triton's ``kernel[grid]``);
``launches``: how many launches took it (tests and benches read it)."""

_CACHE: dict = {}
_MAX_ENTRIES = 4096  # keys hold shapes and values, no tensors; a run has a few dozen
log = logging.getLogger(__name__)


def _arg_key(x: Any):
    if isinstance(x, torch.Tensor):
        return ("t", x.dtype, x.device, x.data_ptr() % 16 == 0)
    if isinstance(x, (bool, int)) or x is None:
        return (type(x), x)
    if isinstance(x, float):
        return float
    base = getattr(x, "base", None)
    if isinstance(base, torch.Tensor):  # a host tensor descriptor (Triton's or Gluon's)
        return ("d", base.dtype, base.device, base.data_ptr() % 16 == 0, tuple(x.shape), tuple(x.strides),
                tuple(x.block_shape), getattr(x, "padding", None), getattr(x, "layout", None),
                getattr(x, "round_f32_to_tf32", None))
    return None  # anything else: no fast path for this launch


def launch_key(kernel, grid_rank: int, args: tuple, constexprs: dict) -> tuple | None:
    """The cache key of a launch of ``kernel`` (None: take the normal path). ``constexprs``:
    the keyword arguments, constexprs and options alike, all keyed by value."""
    keys = tuple(_arg_key(x) for x in args)
    if None in keys:
        return None
    key = (kernel, grid_rank, keys, tuple(sorted(constexprs.items())))
    try:
        hash(key)
    except TypeError:  # an unhashable option or layout
        return None
    return key


def _active(hook) -> bool:
    """Whether a launch hook would run: set, and when a chain of hooks (Triton 3.5+), not empty."""
    return hook is not None and bool(getattr(hook, "calls", True))


def _hooks_set(kernel) -> bool:
    """Whether a hook would see this launch (a profiler's): then Triton launches it."""
    from triton import knobs

    runtime = knobs.runtime
    return (bool(getattr(kernel, "pre_run_hooks", ())) or _active(getattr(runtime, "launch_enter_hook", None))
            or _active(getattr(runtime, "launch_exit_hook", None)))


def launch(kernel, grid: tuple, *args, **constexprs) -> None:
    """``kernel[grid](*args, **constexprs)``, by the compiled kernel's launcher when a launch of
    the same key ran before (see the module's docstring)."""
    key = launch_key(kernel, len(grid), args, constexprs) if FAST["on"] else None
    entry = _CACHE.get(key) if key is not None else None
    if entry is None or _hooks_set(kernel):
        compiled = kernel[grid](*args, **constexprs)
        if key is None or not all(hasattr(compiled, k) for k in ("run", "function", "packed_metadata")):
            return  # (the interpreter returns no compiled kernel)
        names = kernel.arg_names[len(args):]
        if all(name in constexprs for name in names):
            if len(_CACHE) >= _MAX_ENTRIES:
                _CACHE.clear()
            _CACHE[key] = (compiled, [constexprs[name] for name in names])
        return
    compiled, tail = entry
    from triton.runtime.driver import driver

    stream = driver.active.get_current_stream(driver.active.get_current_device())
    g1 = grid[1] if len(grid) > 1 else 1
    g2 = grid[2] if len(grid) > 2 else 1
    try:
        compiled.run(grid[0], g1, g2, stream, compiled.function, compiled.packed_metadata, None, None, None,
                     *args, *tail)
    except TypeError as exc:  # another Triton's launcher signature: the normal path from now on
        FAST["on"] = False
        _CACHE.clear()
        log.warning("ops.launch: the direct launch failed (%s); launching through Triton from now on", exc)
        kernel[grid](*args, **constexprs)
        return
    FAST["launches"] += 1
