"""Queued GPU work for the benchmarks' training-like timings (``--queued-ms``).

In training the loss is called behind the towers' forward, so the GPU already has work queued
and the host's launches hide behind it unless a call waits on the GPU. A benchmark reproduces
that by queueing work before each timed call and starting its timer (CUDA events) behind it:
a sleep kernel (the default), or with :func:`use_gemms` bf16 GEMMs, which also keep the GPU at
its power cap as the towers' matmuls do (behind a sleep the call starts at an idle GPU's clock:
on an H200 cuBLAS runs ~720 TFLOP/s in a single call after an idle second and ~600 through a
burst). Imported by the bench scripts (their folder is on ``sys.path``
when they run)."""

from __future__ import annotations

import torch

_KIND = {"gemm": False}
_GEMMS: dict = {}  # (device, size) -> (operand, output, ms a GEMM)


def use_gemms(on: bool = True) -> None:
    """Queue bf16 GEMMs (8,192^3 each, as many as take about the queued time) instead of a sleep."""
    _KIND["gemm"] = on


def queue_gpu_work(ms: float, device=None, gemm_size: int = 0) -> None:
    """Queue about ``ms`` milliseconds of GPU work on the current stream of ``device`` (a sleep
    kernel, or GEMMs after :func:`use_gemms`, or ``gemm_size``^3 GEMMs when it is given); nothing
    when ``ms`` is 0."""
    if not ms:
        return
    if _KIND["gemm"] or gemm_size:
        a, out, per = _gemm_state(device, gemm_size or 8192)
        for _ in range(max(1, round(ms / per))):
            torch.mm(a, a, out=out)
        return
    rate_khz = torch.cuda.get_device_properties(device).clock_rate  # cycles per ms
    torch.cuda._sleep(int(ms * rate_khz))


def _gemm_state(device, size: int) -> tuple:
    """The queued ``size``^3 GEMMs' operand and output on ``device`` and one GEMM's ms through a
    burst (measured once: 20 GEMMs after 20 unmeasured)."""
    key = (torch.device("cuda" if device is None else device), size)
    if key not in _GEMMS:
        a = torch.randn(size, size, device=key[0], dtype=torch.bfloat16)
        out = torch.empty_like(a)
        for _ in range(20):
            torch.mm(a, a, out=out)
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        for _ in range(20):
            torch.mm(a, a, out=out)
        end.record()
        end.synchronize()
        _GEMMS[key] = (a, out, start.elapsed_time(end) / 20)
    return _GEMMS[key]


def carve_sms(n: int) -> None:
    """Route matrix products through cuBLASLt and tell it to leave ``n`` SMs free for other streams'
    kernels (``torch._C._set_sm_carveout_experimental``; cuBLAS's own path ignores it)."""
    torch.backends.cuda.preferred_blas_library("cublaslt")
    torch._C._set_sm_carveout_experimental(n)
