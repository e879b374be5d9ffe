"""The CLIP loss against an fp64 reference over inputs the op was not tuned to: scales of
either sign up to 1e4, feature norms from 0.1 to 1e3, batches from 1 to a few thousand, odd D;
the torch impls on CPU, the Triton kernels through the interpreter on small shapes (fp32 and
fp16: bf16 dots need a GPU), and the errors the op raises instead of returning wrong numbers.

Tolerance (STYLE 8): within twice torch's own fp32 error (the full-matrix loss through autograd
in fp32), plus, for the gradients, |S|_max 2^-20 of their largest element: the op holds each
row's log-sum-exp as one fp32 number of the logits' magnitude, so every exponent of the backward
carries an error of that order (torch's softmax subtracts the row's maximum, one of its own
logits, and has no such error); at the training scale (|S| <= 100) this term is 1e-4 of the
largest gradient (measured: up to 4e-5).
"""

from __future__ import annotations

import math

import pytest
import torch

from infclip.ops import contrastive_loss
from infclip.ops.blocks import LOGIT_BOUND_LIMIT
from infclip.ops.tuning import TUNING

UPSTREAM = 0.37


def dense(img, txt, scale, dtype, eps=0.0):
    """The CLIP loss computed densely in ``dtype``, written out (log_softmax both ways; label
    smoothing ``eps``), and its gradients."""
    img, txt, scale = (x.detach().to(dtype).requires_grad_() for x in (img, txt, scale))
    logits = scale.reshape(()) * img @ txt.T
    n = logits.shape[0]
    diag = torch.arange(n)
    rows, cols = logits.log_softmax(1), logits.log_softmax(0)
    loss = -0.5 * ((1 - eps) * (rows[diag, diag].mean() + cols[diag, diag].mean())
                   + eps / n * (rows.sum(1).mean() + cols.sum(0).mean()))
    return (loss.detach(), *torch.autograd.grad(loss * UPSTREAM, (img, txt, scale)))


def fp64_reference(img, txt, scale, eps=0.0):
    return dense(img, txt, scale, torch.float64, eps)


def torch_fp32(img, txt, scale, eps=0.0):
    """What torch gives in fp32 for the same loss (the error the tolerance is measured from)."""
    return dense(img, txt, scale, torch.float32, eps)


def ours(img, txt, scale, impl, **kw):
    img, txt, scale = (x.detach().clone().requires_grad_() for x in (img, txt, scale))
    loss = contrastive_loss(img, txt, scale, impl=impl, triton_interpret=impl == "triton", **kw)
    return (loss.detach(), *torch.autograd.grad(loss * UPSTREAM, (img, txt, scale)))


def features(b, d, norm_lo, norm_hi, seed, dtype=torch.float32, aligned=0.0):
    """(img, txt) [b, d] with row norms log-uniform in [norm_lo, norm_hi]; ``aligned``: how much
    of each text row is its image row (0: independent)."""
    gen = torch.Generator().manual_seed(seed)
    img = torch.nn.functional.normalize(torch.randn(b, d, generator=gen, dtype=torch.float64),
                                        dim=1)
    txt = aligned * img + torch.nn.functional.normalize(
        torch.randn(b, d, generator=gen, dtype=torch.float64), dim=1)
    txt = torch.nn.functional.normalize(txt, dim=1)
    lo, hi = math.log(norm_lo), math.log(norm_hi)
    for x in (img, txt):
        x.mul_(torch.exp(lo + (hi - lo) * torch.rand(b, 1, generator=gen, dtype=torch.float64)))
    return img.to(dtype), txt.to(dtype)


def check(img, txt, scale, got, what, eps=0.0):
    ref = fp64_reference(img, txt, scale, eps)
    low = torch_fp32(img, txt, scale, eps)
    norm = max(img.double().norm(dim=1).max().item(), txt.double().norm(dim=1).max().item())
    bound = abs(float(scale)) * norm**2
    # the gradients are sums of terms up to g |s| |T| (d image) or g |S'| (d scale) that can
    # cancel to ~0: their fp32 rounding is relative to the terms, not to the result
    terms = UPSTREAM * max(abs(float(scale)) * norm, norm**2)
    names = ("loss", "d image", "d text", "d scale")
    for name, g, r, t in zip(names, got, ref, low):
        big = r.abs().max().item()
        torch_err = (t.double() - r).abs().max().item()
        err = (g.double() - r).abs().max().item()
        tol = 2 * torch_err + 1e-6 * big + 1e-30
        if name != "loss":
            tol += bound * 2.0**-20 * big + 2.0**-20 * terms
        if name in ("d image", "d text") and img.dtype != torch.float32:
            tol += 2.0**-10 * big  # the feature gradients are returned in the features' dtype
        assert math.isfinite(err) and err <= tol, (
            f"{what}: {name} off by {err:.3g} (largest {big:.3g}; torch fp32 {torch_err:.3g}, "
            f"tolerance {tol:.3g})")


SCALES = (-1e4, -300.0, -1.0, 0.0, 0.5, 14.3, 100.0, 300.0, 1e4)
NORMS = ((0.1, 0.1), (0.1, 2.0), (1.0, 1.0), (3.0, 30.0), (1e3, 1e3))


def grid():
    """(scale, norms) pairs whose logit bound stays inside the range the op takes."""
    return [(s, n) for s in SCALES for n in NORMS if abs(s) * n[1] ** 2 <= LOGIT_BOUND_LIMIT]


@pytest.mark.parametrize("impl,b,d", [("naive", 1, 3), ("naive", 37, 7), ("chunked_torch", 37, 7),
                                      ("chunked_torch", 300, 13)])
def test_clip_matches_fp64_over_scales_and_norms(impl, b, d):
    for k, (scale, (lo, hi)) in enumerate(grid()):
        for aligned in (0.0, 2.0):
            img, txt = features(b, d, lo, hi, seed=k, aligned=aligned)
            s = torch.tensor(scale)
            check(img, txt, s, ours(img, txt, s, impl, block_m=16, block_n=24),
                  f"{impl} B={b} D={d} s={scale} norms {lo}-{hi} aligned {aligned}")


def test_clip_matches_fp64_at_a_few_thousand_rows():
    img, txt = features(2049, 9, 0.1, 10.0, seed=5)
    for scale in (-300.0, 1e4):
        s = torch.tensor(scale)
        check(img, txt, s, ours(img, txt, s, "chunked_torch"), f"chunked_torch B=2049 s={scale}")


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16])
def test_triton_interpreted_matches_fp64(dtype):
    cases = [(-1e4, (1.0, 1.0)), (300.0, (1.0, 1.0)), (100.0, (3.0, 3.0)), (-30.0, (0.1, 10.0)),
             (1e4, (0.1, 0.1))]
    for k, (scale, (lo, hi)) in enumerate(cases):
        img, txt = features(21, 11, lo, hi, seed=k, dtype=dtype)
        s = torch.tensor(scale)
        check(img, txt, s, ours(img, txt, s, "triton"), f"triton {dtype} s={scale} norms {lo}-{hi}")


@pytest.mark.parametrize("impl", ["naive", "chunked_torch", "triton"])
def test_rows_far_below_their_bound_keep_their_sum(impl):
    """Unit rows (1, 0) against (-1, 0) at s = 100: every logit 200 below its Cauchy-Schwarz
    bound (the shifts take the rows' true maxima); the loss is ln B."""
    img = torch.tensor([[1.0, 0.0]] * 4)
    txt = torch.tensor([[-1.0, 0.0]] * 4)
    s = torch.tensor(100.0)
    got = ours(img, txt, s, impl)
    assert abs(got[0].item() - math.log(4)) < 1e-6
    check(img, txt, s, got, impl)


def test_logit_bound_above_the_limit_is_nan_or_an_error():
    img, txt = features(6, 5, 1e3, 1e3, seed=0)
    s = torch.tensor(1e4)
    assert torch.isnan(contrastive_loss(img, txt, s))
    with pytest.raises(ValueError, match="largest logit bound"):
        contrastive_loss(img, txt, s, check_finite="raise")


def test_inputs_the_op_does_not_take_are_errors():
    img, txt = features(6, 5, 1.0, 1.0, seed=0)
    s = torch.tensor(10.0)
    with pytest.raises(ValueError, match="logit_bias applies to loss 'siglip' only"):
        contrastive_loss(img, txt, s, torch.tensor(0.0))
    with pytest.raises(TypeError, match="real floating-point"):
        contrastive_loss(img, txt, torch.tensor(10.0 + 1.0j))
    with pytest.raises(TypeError, match="float32, bfloat16 or float16"):
        contrastive_loss(img.double(), txt.double(), s)


@pytest.mark.parametrize("loss", ["clip", "siglip"])
def test_second_order_gradient_is_an_error_naming_the_op(loss):
    img, txt = (x.requires_grad_() for x in features(6, 5, 1.0, 1.0, seed=0))
    s = torch.tensor(10.0, requires_grad=True)
    bias = torch.tensor(-1.0) if loss == "siglip" else None
    value = contrastive_loss(img, txt, s, bias, loss=loss)
    grad, = torch.autograd.grad(value, img, create_graph=True)
    first, = torch.autograd.grad(contrastive_loss(img, txt, s, bias, loss=loss), img)
    assert torch.equal(grad.detach(), first)  # the first-order gradient is unchanged
    with pytest.raises(RuntimeError, match="contrastive_loss has no second-order gradient"):
        torch.autograd.grad(grad.square().sum(), img)


@pytest.mark.parametrize("transposed", [False, True])
@pytest.mark.parametrize("impl", ["chunked_torch", "triton"])
def test_a_few_loose_rows_among_many(impl, transposed):
    """Unit features at s = 100: every text and most images 0.8 e_0 + 0.6 u (u random, unit, _|_
    e_0), every 7th image -e_0: those rows' logits all lie at -80, 116 below their shift from the
    bound, and underflow unless the shift is their true maximum; the other rows' shifts stay as
    the bound made them (the Triton shift launch has programs of both kinds). ``transposed``:
    the same as loose columns."""
    gen = torch.Generator().manual_seed(11)
    u = torch.nn.functional.normalize(torch.randn(2, 45, 8, generator=gen), dim=-1)
    img, txt = (torch.cat([torch.full((45, 1), 0.8), 0.6 * v], 1) for v in u)
    img[::7] = 0.0
    img[::7, 0] = -1.0
    if transposed:
        img, txt = txt, img
    s = torch.tensor(100.0)
    check(img, txt, s, ours(img, txt, s, impl, block_m=16, block_n=24), f"{impl} loose rows")


@pytest.mark.parametrize("impl", ["chunked_torch", "triton"])
def test_label_smoothing_with_loose_shifts(impl):
    """Label smoothing 0.1 where the shifts come from the rows' true maxima (negative scale) and
    where they come from the bound."""
    for scale, norms in ((-300.0, (0.1, 2.0)), (100.0, (1.0, 1.0))):
        img, txt = features(33, 7, *norms, seed=2, aligned=2.0)
        s = torch.tensor(scale)
        got = ours(img, txt, s, impl, block_m=16, block_n=24, label_smoothing=0.1)
        check(img, txt, s, got, f"{impl} s={scale} label smoothing", eps=0.1)


def test_band_logits_take_a_smaller_bound(monkeypatch):
    """Logits kept as 16-bit bands (fp16 here: the interpreter's bf16 dots are wrong) are rounded
    to 2^-11 of their size: above a bound of 2^14 the loss is NaN, not an overflow; below it,
    finite."""
    monkeypatch.setattr(TUNING, "bands_min_logits", 0)
    monkeypatch.setattr(TUNING, "bands_dtypes", (torch.bfloat16, torch.float16))
    img, txt = (x.requires_grad_() for x in  # (a backward follows: the logits are kept)
                features(40, 7, 1.0, 1.0, seed=4, dtype=torch.float16, aligned=2.0))
    budget = 40 * 40 * 3 / 2**20  # MiB: the fp16 bands (2 bytes a pair), not S' in fp32 (6)
    for scale, nan in ((2.0**14 * 1.01, True), (2.0**14 * 0.99, False), (100.0, False)):
        loss = contrastive_loss(img, txt, torch.tensor(scale), impl="triton",
                                triton_interpret=True, logits_budget_mb=budget)
        assert bool(torch.isnan(loss)) == nan and (nan or bool(torch.isfinite(loss))), scale
