"""The distributed sweeps' d loss / d s summed in their gradient blocks against the forward's
weighted sums, rank 0 of an N-rank group on one device.

Rank 0 runs the loss assembly through the emulated sweep of bench/bench_rank_compute.py (the real
steps and shapes, the other ranks' column blocks made up front, collectives as local work). Its
numbers are not the whole batch's, but both ways of taking d loss / d s must give the same ones on
the same inputs: the forward's weighted sums (the per-tile statistics kernels) and the plain sums
by column strips with each gradient block summing its share (TUNING.sweeps_sum_dscale). On the
CPU: the Triton interpreter with the TMA kernels forced, tiny blocks. On a GPU (`pytest -m gpu`):
b = 12,288 rows (b x b at the strips' size), bf16, the Gluon kernels on sm_90. The real
multi-process checks: tests/ops/test_distributed.py (gloo), tests/ops/_nccl_worker.py (NCCL).
"""

import os
import sys

import pytest
import torch

from infclip.ops import assembly
from infclip.ops import contrastive_loss_triton as tri
from infclip.ops.tuning import TUNING

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "..", "bench"))
import bench_rank_compute as emulation  # noqa: E402

CASES = [(scheme, world, eps) for scheme in ("disco", "ring", "hierarchical_ring")
         for world, eps in ((2, 0.0), (2, 0.1), (4, 0.0))]


def _features(world: int, b: int, d: int, device: str):
    gen = torch.Generator(device=device).manual_seed(world)
    img = torch.nn.functional.normalize(torch.randn(world * b, d, device=device, generator=gen), dim=-1)
    txt = torch.nn.functional.normalize(img + torch.randn(world * b, d, device=device, generator=gen), dim=-1)
    return img, txt


def _rank0(scheme, world, eps, summed, img, txt, monkeypatch):
    """[loss, d_img, d_txt, d_scale] of rank 0, and the dscale_summed of each gradient call."""
    monkeypatch.setattr(TUNING, "sweeps_sum_dscale", summed)
    calls, real = [], tri.clip_grads_triton
    monkeypatch.setattr(tri, "clip_grads_triton",
                        lambda *a, **k: (calls.append(bool(k.get("dscale_summed"))), real(*a, **k))[1])
    b = img.shape[0] // world
    sw = emulation.emulated(scheme, world, [txt[r * b:(r + 1) * b] for r in range(1, world)])
    o = assembly.Options("clip", "triton", eps, False, 0, 0, float(world))
    s, g = (torch.tensor(v, device=img.device) for v in (14.0, 0.37))
    loss, row_lse, col_lse, aux, kept = assembly.clip_forward(img[:b], txt[:b], s, sw, o)
    grads = assembly.clip_backward(g, img[:b], txt[:b], s, row_lse, col_lse, aux, kept, sw, o)
    return [loss, *grads], calls


def _check(scheme, world, eps, img, txt, monkeypatch, tols):
    got, calls = _rank0(scheme, world, eps, True, img, txt, monkeypatch)
    assert calls and all(calls), calls  # every gradient block summed its share
    want, calls = _rank0(scheme, world, eps, False, img, txt, monkeypatch)
    assert calls and not any(calls), calls
    for name, x, y, tol in zip(("loss", "d_img", "d_txt", "d_scale"), got, want, tols):
        err = float((x.float() - y.float()).abs().max() / y.float().abs().max())
        assert err <= tol, f"{name}: {err:.3g} relative"


@pytest.mark.skipif(os.environ.get("TRITON_INTERPRET") != "1", reason="the Triton interpreter (tests/run.sh)")
@pytest.mark.parametrize("scheme,world,eps", CASES)
def test_summed_d_scale_equals_the_weighted_sums(scheme, world, eps, monkeypatch):
    monkeypatch.setattr(TUNING, "tma_force", True)
    monkeypatch.setattr(TUNING, "strips_min_logits", 0)
    img, txt = _features(world, 16, 16, "cpu")
    _check(scheme, world, eps, img, txt, monkeypatch, (1e-6, 1e-5, 1e-5, 1e-5))


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
@pytest.mark.parametrize("scheme,world,eps", CASES)
def test_summed_d_scale_equals_the_weighted_sums_gpu(scheme, world, eps, monkeypatch):
    b = 12288
    img, txt = (x.bfloat16() for x in _features(world, b, 256, "cuda"))
    assert tri.sums_in_strips(img[:b], txt[:b], "")
    _check(scheme, world, eps, img, txt, monkeypatch, (1e-5, 1e-3, 1e-3, 1e-4))
