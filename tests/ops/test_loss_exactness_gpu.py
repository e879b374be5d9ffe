"""The CLIP loss against fp64 on the GPU over inputs the op was not tuned to (device machine only:
`pytest -m gpu tests/ops/test_loss_exactness_gpu.py`): scales of either sign up to 1e4, feature
norms 0.1 to 30, bf16 / fp16 / fp32, the triton impl on its paths (fused, the whole matrix kept,
forced row bands, the column-strip sums), and the shifts the bound leaves loose on a few rows only.

Tolerance (STYLE 8): |ours - ref64| <= 2 |torch_lowp - ref64| + atol + slack. torch_lowp is the
dense loss a user would write for these features: the matmul in the features' dtype (as autocast
does), the scale and the softmax in fp32 (the scale applied in fp32, so that a scale of 1e4 does
not overflow fp16 where the logits do not). slack, as in tests/ops/test_loss_exactness.py (which
says why): for the gradients, |S|max 2^-20 of their largest element, and 2^-22 max(|S'|max, 64)
of the terms they sum (|S'|max: the largest logit present). The op keeps each row's log-sum-exp
as one fp32 number of the logits' magnitude and recomputes or re-reads the logits in the
backward, so each probability exp(s_ij - lse_i) carries an absolute exponent error of about an
ulp of |S'|max (and, below 64, of the exp2 arguments, shifted logits up to SHIFT_SLACK log2(e) ~
69): a relative error of each term, which survives where the terms cancel. At B = 1 they cancel
exactly (the true gradients are 0; torch's softmax, subtracting the row's own maximum, gets 0
too), so these cases measure it: up to 2^-12.8 of the terms at |S'| ~ 1e4 to 1e5 (s = -300,
norms 30), 2^-16.6 at |S'| ~ 1e4 (s = -1e4, norms 1).
"""

import math

import pytest
import torch
import torch.nn.functional as F

from infclip.ops import contrastive_loss
from infclip.ops.blocks import LOGIT_BOUND_LIMIT
from infclip.ops.tuning import TUNING, tuning

pytestmark = pytest.mark.gpu

if not torch.cuda.is_available():
    pytest.skip("needs CUDA", allow_module_level=True)

UPSTREAM = 1.37


def _features(b, d, dtype, norms, seed, aligned):
    g = torch.Generator(device="cuda").manual_seed(seed)
    img = F.normalize(torch.randn(b, d, device="cuda", generator=g, dtype=torch.float64), dim=-1)
    txt = F.normalize(aligned * img + torch.randn(b, d, device="cuda", generator=g,
                                                  dtype=torch.float64), dim=-1)
    lo, hi = math.log(norms[0]), math.log(norms[1])
    for x in (img, txt):
        x.mul_(torch.exp(lo + (hi - lo) * torch.rand(b, 1, device="cuda", generator=g,
                                                     dtype=torch.float64)))
    return img.to(dtype), txt.to(dtype)


def _grads(fn, img, txt, scale):
    leaves = [x.detach().clone().requires_grad_() for x in (img, txt, scale)]
    loss = fn(*leaves)
    (loss * UPSTREAM).backward()
    return [loss.detach().double()] + [x.grad.double() for x in leaves]


def _dense(img, txt, scale, work=None):
    """The dense CLIP loss: S' = I T^T in ``work`` (default: the features' dtype), the rest fp32
    (fp64 for an fp64 ``work``)."""
    if work is not None:
        img, txt, scale = img.to(work), txt.to(work), scale.to(work)
    out = torch.float64 if work == torch.float64 else torch.float32
    logits = (img @ txt.T).to(out) * scale.to(out)
    lab = torch.arange(img.shape[0], device=img.device)
    return 0.5 * (F.cross_entropy(logits, lab) + F.cross_entropy(logits.T, lab))


def _check(img, txt, scale, what, **kw):
    ours = _grads(lambda i, t, s: contrastive_loss(i, t, s, impl="triton", **kw), img, txt, scale)
    ref = _grads(lambda i, t, s: _dense(i, t, s, torch.float64), img, txt, scale)
    low = _grads(_dense, img, txt, scale)
    norm = max(img.double().norm(dim=1).max().item(), txt.double().norm(dim=1).max().item())
    s = abs(float(scale))
    terms = UPSTREAM * max(s * norm, norm**2)
    logit_max = s * (img.double() @ txt.double().T).abs().max().item()
    for name, o, r, lo in zip(["loss", "d_img", "d_txt", "d_scale"], ours, ref, low):
        big = r.abs().max().item()
        err = (o - r).abs().max().item()
        torch_err = (lo - r).abs().max().item()
        # fp32 accumulation-order differences (the cuBLAS and tl.dot sums round differently)
        tol = 2 * torch_err + 1e-5 * big + 1e-30
        if name != "loss":
            tol += 2.0**-20 * s * norm**2 * big + 2.0**-22 * max(logit_max, 64.0) * terms
        assert math.isfinite(err) and err <= tol, (
            f"{what}: {name} off by {err:.3g} (largest {big:.3g}, torch {torch_err:.3g}, "
            f"tolerance {tol:.3g})")


SCALES = (-1e4, -300.0, 0.5, 100.0, 300.0, 1e4)
NORMS = ((0.1, 0.1), (0.1, 3.0), (1.0, 1.0), (30.0, 30.0))
PATHS = {"default": {}, "kept": dict(logits_budget_mb=4096.0), "banded": dict(block_m=1000),
         "recompute": dict(logits_budget_mb=0.0), "kept_bands": dict(logits_budget_mb=40.0)}


@pytest.mark.parametrize("path", list(PATHS))
@pytest.mark.parametrize("b,d", [(1, 64), (7, 100), (1000, 768), (4097, 640)])
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16, torch.float32])
def test_clip_matches_fp64_over_scales_and_norms(monkeypatch, dtype, b, d, path):
    """Every path at every scale and norm whose bound it takes (above it, a NaN loss)."""
    if path == "banded" and b < 1000:
        pytest.skip("one band")
    if path == "kept_bands" and (dtype != torch.bfloat16 or b < 4097):
        pytest.skip("bf16 bands (40 MB: 2 bytes a pair at B = 4,097, not 6)")
    if path == "kept_bands":
        monkeypatch.setattr(TUNING, "bands_min_logits", 0)
    # the kept bands' logits are rounded to bf16: the smaller bound they take
    limit = 2**12 if path == "kept_bands" else LOGIT_BOUND_LIMIT
    for k, scale in enumerate(SCALES):
        for norms in NORMS:
            if abs(scale) * norms[1] ** 2 > limit:
                continue
            for aligned in (0.0, 2.0):
                img, txt = _features(b, d, dtype, norms, seed=k + b, aligned=aligned)
                _check(img, txt, torch.full((1,), scale, device="cuda"),
                       f"{dtype} B={b} D={d} {path} s={scale} norms {norms} aligned {aligned}",
                       **PATHS[path])


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
@pytest.mark.parametrize("scale", [-300.0, 100.0, 1e4])
def test_strip_sums_match_fp64(dtype, scale):
    """B = 12,288: the forward takes the column-strip sums (on sm_90 the Gluon kernel), the
    backward sums d scale."""
    img, txt = _features(12288, 768, dtype, (0.5, 2.0), seed=1, aligned=2.0)
    _check(img, txt, torch.full((1,), scale, device="cuda"), f"strips {dtype} s={scale}")


@pytest.mark.parametrize("transposed", [False, True])
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16, torch.float32])
@pytest.mark.parametrize("b", [1000, 12288])
def test_a_few_loose_rows_among_many(dtype, b, transposed):
    """s = 100, every text and most images 0.8 e_0 + 0.6 u (u unit, _|_ e_0), every 97th image
    -e_0: those rows' logits all lie at -80, 116 below their shift from the bound, and underflow
    unless the shift launch gives them their true maxima; the other programs only check.
    ``transposed``: the same as loose columns."""
    g = torch.Generator(device="cuda").manual_seed(3)
    u = F.normalize(torch.randn(2, b, 767, device="cuda", generator=g, dtype=torch.float64), dim=-1)
    img, txt = (torch.cat([torch.full((b, 1), 0.8, device="cuda", dtype=torch.float64), 0.6 * v], 1)
                for v in u)
    img[::97] = 0.0
    img[::97, 0] = -1.0
    if transposed:
        img, txt = txt, img
    _check(img.to(dtype), txt.to(dtype), torch.full((1,), 100.0, device="cuda"),
           f"loose rows {dtype} B={b} transposed {transposed}")


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16, torch.float32])
def test_rows_far_below_their_bound_keep_their_sum(dtype):
    """Every image row (1, 0, ...), every text row (-1, 0, ...), s = 100: the loss is ln B."""
    img = torch.zeros(4096, 256, device="cuda", dtype=dtype)
    img[:, 0] = 1.0
    loss = contrastive_loss(img, -img, torch.full((1,), 100.0, device="cuda"), impl="triton")
    assert abs(loss.item() - math.log(4096)) < 1e-5 * math.log(4096)


def test_kept_bands_above_their_bound_give_nan():
    """bf16 bands kept (their logits rounded to bf16) at a bound above 2^12: a NaN loss, not an
    overflow."""
    img, txt = (x.requires_grad_() for x in  # (a backward follows: the logits are kept)
                _features(4097, 640, torch.bfloat16, (1.0, 1.0), seed=0, aligned=2.0))
    scale = torch.full((1,), 1e4, device="cuda")
    with tuning(bands_min_logits=0):
        loss = contrastive_loss(img, txt, scale, impl="triton", logits_budget_mb=40.0)
    assert torch.isnan(loss)
