"""GPU tests of the Triton kernels (device machine only): `pytest -m gpu tests/ops`.

Tolerance (shared/STYLE.md item 8): |ours - ref64| <= 2 |torch_lowp - ref64| + atol, where
torch_lowp is the same loss in plain torch on the low-precision features (matmul in the
features' dtype, softmax in fp32: what autocast does) and ref64 is fp64 on the same inputs.
"""

import importlib

import pytest
import torch
import torch.nn.functional as F

from infclip.ops import contrastive_loss, contrastive_loss_reference
from infclip.ops.tuning import TUNING

pytestmark = pytest.mark.gpu

if not torch.cuda.is_available():
    pytest.skip("needs CUDA", allow_module_level=True)


def _inputs(b, d, dtype, seed=0):
    g = torch.Generator(device="cuda").manual_seed(seed)
    img = F.normalize(torch.randn(b, d, device="cuda", generator=g, dtype=torch.float64), dim=-1)
    txt = F.normalize(img + 0.7 * torch.randn(b, d, device="cuda", generator=g, dtype=torch.float64), dim=-1)
    return img.to(dtype), txt.to(dtype)


def _grads(fn, img, txt, scale, bias, upstream):
    leaves = [x.detach().clone().requires_grad_() for x in (img, txt, scale)]
    b = bias.detach().clone().requires_grad_() if bias is not None else None
    loss = fn(*leaves, b)
    (loss * upstream).backward()
    out = [loss.detach().double()] + [x.grad.double() for x in leaves]
    if b is not None:
        out.append(b.grad.double())
    return out


def _torch_lowp(loss, eps):
    def fn(img, txt, scale, bias):
        logits = (scale.to(img.dtype) * img @ txt.T).float()
        n = img.shape[0]
        if loss == "clip":
            lab = torch.arange(n, device=img.device)
            return 0.5 * (F.cross_entropy(logits, lab, label_smoothing=eps)
                          + F.cross_entropy(logits.T, lab, label_smoothing=eps))
        z = 2 * torch.eye(n, device=img.device) - 1
        return -F.logsigmoid(z * (logits + bias.float())).sum() / n
    return fn


def _check(b, d, dtype, loss="clip", eps=0.0, tf32=False, **kw):
    img, txt = _inputs(b, d, dtype, seed=b + d)
    scale = torch.full((1,), 17.0, device="cuda")
    bias = torch.full((1,), -4.0, device="cuda") if loss == "siglip" else None
    upstream = 1.37
    ours = _grads(lambda i, t, s, bb: contrastive_loss(i, t, s, bb, loss=loss, impl="triton",
                                                        label_smoothing=eps, allow_tf32=tf32, **kw),
                  img, txt, scale, bias, upstream)
    ref = _grads(lambda i, t, s, bb: contrastive_loss_reference(
        i.double(), t.double(), s.double(), bb.double() if bb is not None else None, loss=loss,
        label_smoothing=eps), img, txt, scale, bias, upstream)
    if dtype == torch.float32 and not tf32:
        for o, r in zip(ours, ref):
            # 1e-5 relative (shared/BENCHMARKS.md); B = 1 has an exactly-zero loss, hence the max(., 1)
            assert torch.allclose(o, r, rtol=1e-5, atol=1e-5 * max(r.abs().max().item(), 1.0))
        return
    # the yardstick runs at the same precision: TF32 matmuls when ours may use TF32
    prev = torch.backends.cuda.matmul.allow_tf32
    torch.backends.cuda.matmul.allow_tf32 = tf32
    try:
        low = _grads(_torch_lowp(loss, eps), img, txt, scale, bias, upstream)
    finally:
        torch.backends.cuda.matmul.allow_tf32 = prev
    for name, o, r, lo in zip(["loss", "d_img", "d_txt", "d_scale", "d_bias"], ours, ref, low):
        err = (o - r).abs().max().item()
        torch_err = (lo - r).abs().max().item()
        # fp32 accumulation-order differences on logits of size ~scale (B = 1: torch's loss is exactly 0);
        # TF32 mode: allow 2^-10 of the value (the GEMMs are cuBLAS's now, as torch's, but the two
        # sums may still round differently)
        atol = (2.0**-10 if tf32 else 1e-5) * max(r.abs().max().item(), 1.0)
        assert err <= 2 * torch_err + atol, f"{name}: ours {err:.3e} vs torch {torch_err:.3e}"


@pytest.mark.parametrize("b", [1, 7, 1000, 4097])
@pytest.mark.parametrize("d", [64, 100, 640, 768, 1024, 1280])
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16, torch.float32])
def test_grid_clip(b, d, dtype):
    _check(b, d, dtype)


@pytest.mark.parametrize("b,d", [(4097, 768), (1000, 640)])
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
def test_siglip_and_smoothing(b, d, dtype):
    _check(b, d, dtype, loss="siglip")
    _check(b, d, dtype, eps=0.1)


@pytest.mark.parametrize("loss,eps", [("clip", 0.0), ("clip", 0.1), ("siglip", 0.0)])
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
@pytest.mark.parametrize("path", ["kept", "kept_bands", "banded", "banded_aligned", "memory_bands",
                                  "blocks"])
def test_paths(monkeypatch, path, dtype, loss, eps):
    """The triton paths at awkward shapes: the whole matrix kept from forward to backward (fp32),
    the forward's bands kept in the features' dtype (a budget for 2 bytes a pair, not 6), forced
    row bands (an uneven last band; "banded_aligned": B = 4,096, whose P rows are 16-byte aligned,
    so the fused gradient kernels store P by TMA descriptor, else by pointers), the recompute
    with bands by the memory rule, and ("blocks") the backward's blocks of rows x columns where
    the memory rule says the matrix does not fit (forced small: 1,536 x 1,000, the last column
    block 97 wide, whose P rows are not 16-byte aligned)."""
    kw = {"kept": dict(logits_budget_mb=1024.0), "kept_bands": dict(logits_budget_mb=40.0),
          "banded": dict(block_m=1000), "banded_aligned": dict(block_m=1000),
          "memory_bands": dict(logits_budget_mb=0.0), "blocks": dict(logits_budget_mb=0.0)}[path]
    if path == "kept_bands":
        monkeypatch.setattr(TUNING, "bands_min_logits", 0)  # bands kept at this B (default: above 16,384)
    if path == "blocks":
        tri = importlib.import_module("infclip.ops.contrastive_loss_triton")
        monkeypatch.setattr(tri, "band_rows", lambda m, n, d: 1000)
        monkeypatch.setattr(TUNING, "grad_block", (1536, 1000))
    b, d = (4096, 768) if path == "banded_aligned" else (4097, 640)
    _check(b, d, dtype, loss=loss, eps=eps, **kw)


@pytest.mark.parametrize("loss", ["clip", "siglip"])
@pytest.mark.parametrize("b", [1024, 8192])
def test_cuda_graph_capture(b, loss):
    """Default arguments, no host sync: forward + backward captured in a CUDA graph and replayed
    on new inputs give the eager numbers (b = 1024 keeps the logits, 8192 recomputes bands)."""
    img, txt = _inputs(b, 768, torch.bfloat16, seed=3)
    img, txt = img.requires_grad_(), txt.requires_grad_()
    scale = torch.full((1,), 20.0, device="cuda", requires_grad=True)
    bias = torch.full((1,), -8.0, device="cuda", requires_grad=True) if loss == "siglip" else None
    leaves = [x for x in (img, txt, scale, bias) if x is not None]

    def step():
        out = contrastive_loss(img, txt, scale, bias, loss=loss)
        out.backward()
        return out

    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        for _ in range(2):  # warm-up (kernel compilation) off the capture
            step()
            for x in leaves:
                x.grad = None
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        captured = step()
    new_img, new_txt = _inputs(b, 768, torch.bfloat16, seed=4)
    with torch.no_grad():
        img.copy_(new_img)
        txt.copy_(new_txt)
    graph.replay()
    torch.cuda.synchronize()
    replayed = [captured.clone()] + [x.grad.clone() for x in leaves]
    for x in leaves:
        x.grad = None
    eager = [step()] + [x.grad for x in leaves]
    for r, e in zip(replayed, eager):
        torch.testing.assert_close(r.float(), e.float(), rtol=1e-3, atol=1e-5 * max(e.abs().max().item(), 1))


@pytest.mark.parametrize("b,eps", [(8200, 0.0), (8200, 0.1), (16384, 0.0)])
def test_strip_statistics_match_the_tile_kernel(monkeypatch, b, eps):
    """The default forward on Hopper (plain sums by column strips, d scale summed by the
    backward's gradient kernel; B = 8,200: partial edge tiles, a last chunk of one row block)
    gives the per-tile forward's loss and gradients (its weighted sums, d scale from them), and
    both pass the reference check."""
    tri = importlib.import_module("infclip.ops.contrastive_loss_triton")
    if torch.cuda.get_device_capability()[0] < 9:
        pytest.skip("the strips load by TMA (Hopper)")
    monkeypatch.setattr(TUNING, "strips_min_logits", 0)  # (8,200: below the default)
    calls = []
    launch = tri._clip_sums_strips
    monkeypatch.setattr(tri, "_clip_sums_strips", lambda *a: (calls.append(1), launch(*a))[1])
    img, txt = _inputs(b, 768, torch.bfloat16, seed=b)
    scale = torch.full((1,), 17.0, device="cuda")
    run = lambda: _grads(lambda i, t, s, _: contrastive_loss(  # noqa: E731
        i, t, s, impl="triton", label_smoothing=eps, graph_max_batch=0), img, txt, scale, None, 1.37)
    strips = run()
    assert calls == [1]
    monkeypatch.setattr(TUNING, "strips", False)
    tiles = run()
    assert calls == [1]
    # the same P but for the last bits of the LSEs (sums in another order): a bf16 gradient may
    # round an element the other way
    for name, o, t, tol in zip(["loss", "d_img", "d_txt", "d_scale"], strips, tiles,
                               [1e-5, 1e-2, 1e-2, 1e-4]):
        assert torch.allclose(o, t, rtol=tol, atol=tol * t.abs().max().item()), name
    monkeypatch.setattr(TUNING, "strips", True)
    _check(b, 768, torch.bfloat16, eps=eps)


def test_tf32_mode():
    _check(4097, 768, torch.float32, tf32=True)


def test_large_batch_matches_chunked_torch():
    img, txt = _inputs(32768, 768, torch.bfloat16)
    scale = torch.full((1,), 30.0, device="cuda")
    a = _grads(lambda i, t, s, _: contrastive_loss(i, t, s, impl="triton"), img, txt, scale, None, 1.0)
    c = _grads(lambda i, t, s, _: contrastive_loss(i, t, s, impl="chunked_torch", block_m=8192,
                                                      block_n=8192), img, txt, scale, None, 1.0)
    for o, r in zip(a, c):
        assert torch.allclose(o, r, rtol=2e-2, atol=2e-2 * r.abs().max().item())


@pytest.mark.parametrize("b, bar_gib", [(32768, 0.19), (65536, 0.38)])
def test_peak_memory_within_its_bars(b, bar_gib):
    """The CLIP op's forward + backward at its defaults holds at most 0.19 / 0.38 GiB above its
    inputs at 32k / 65k (the features' gradients included), measured as bench_contrastive_loss.py
    does. A backward that kept a view of P's buffer past its block loop (TMA descriptors, say)
    would hold 0.22 / 0.44."""
    img, txt = _inputs(b, 768, torch.bfloat16)
    img.requires_grad_()
    txt.requires_grad_()
    scale = torch.full((1,), 14.3, device="cuda", requires_grad=True)
    contrastive_loss(img, txt, scale, impl="triton").backward()  # warm-up: kernels built
    img.grad = txt.grad = scale.grad = None
    torch.cuda.synchronize()
    torch.cuda.empty_cache()
    torch.cuda.reset_peak_memory_stats()
    base = torch.cuda.memory_allocated()
    contrastive_loss(img, txt, scale, impl="triton").backward()
    peak = torch.cuda.max_memory_allocated() - base
    assert peak <= bar_gib * 2**30, f"peak extra {peak / 2**30:.3f} GiB at B = {b}"


def test_262144_fits():
    img, txt = _inputs(262144, 768, torch.bfloat16)
    img.requires_grad_()
    txt.requires_grad_()
    scale = torch.full((1,), 14.3, device="cuda", requires_grad=True)
    torch.cuda.reset_peak_memory_stats()
    base = torch.cuda.memory_allocated()
    loss = contrastive_loss(img, txt, scale, impl="triton")
    loss.backward()
    peak = torch.cuda.max_memory_allocated() - base
    assert torch.isfinite(loss) and torch.isfinite(img.grad).all() and torch.isfinite(scale.grad).all()
    assert peak <= 3 * 262144 * 768 * 4 + 64 * 262144, f"peak extra {peak / 2**30:.2f} GiB"
