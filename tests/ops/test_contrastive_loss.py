"""CPU tests of the contrastive loss op: every impl against the full-matrix reference.

Tolerances (shared/STYLE.md item 8): fp32 within 1e-5 relative of an fp64 reference; fp16 /
bf16 within 2x torch's own low-precision error on the same inputs plus a small atol. The
Triton kernels run under TRITON_INTERPRET=1 (set by tests/run.sh and conftest.py) in fp32 and
fp16 only: the interpreter cannot do bf16 dots (shared/ENVIRONMENT.md).
"""

import logging
import math

import pytest
import torch
import torch.nn.functional as F

import ops
import ops.contrastive_loss_triton as triton_impl
from ops import ConfigError, ContrastiveLoss, ContrastiveLossConfig, contrastive_loss
from ops import contrastive_loss_reference

UPSTREAM = 1.7


def _inputs(b, d, dtype, seed=0, scale=14.3, bias=-3.0, normalise=True):
    g = torch.Generator().manual_seed(seed)
    img = torch.randn(b, d, generator=g, dtype=torch.float64)
    txt = img + 0.8 * torch.randn(b, d, generator=g, dtype=torch.float64)
    if normalise:
        img, txt = F.normalize(img, dim=-1), F.normalize(txt, dim=-1)
    return img.to(dtype), txt.to(dtype), torch.tensor([scale]), torch.tensor([bias])


def _run(fn, img, txt, scale, bias, siglip):
    leaves = [x.detach().clone().requires_grad_() for x in (img, txt, scale, bias)]
    loss = fn(leaves[0], leaves[1], leaves[2], leaves[3] if siglip else None)
    (loss * UPSTREAM).backward()
    out = {"loss": loss.detach().double(), "d_img": leaves[0].grad.double(),
           "d_txt": leaves[1].grad.double(), "d_scale": leaves[2].grad.double()}
    if siglip:
        out["d_bias"] = leaves[3].grad.double()
    return out


def _reference(img, txt, scale, bias, loss, eps):
    return _run(lambda i, t, s, b: contrastive_loss_reference(
        i.double(), t.double(), s.double(), b.double() if b is not None else None, loss=loss,
        label_smoothing=eps), img, txt, scale, bias, loss == "siglip")


def _torch_lowp(img, txt, scale, bias, loss, eps):
    """Plain torch on the low-precision features: matmul in their dtype, losses in fp32."""
    def fn(i, t, s, b):
        logits = (s.to(i.dtype) * i @ t.T).float()
        n = i.shape[0]
        if loss == "clip":
            lab = torch.arange(n)
            return 0.5 * (F.cross_entropy(logits, lab, label_smoothing=eps)
                          + F.cross_entropy(logits.T, lab, label_smoothing=eps))
        z = 2 * torch.eye(n) - 1
        return -F.logsigmoid(z * (logits + b.float())).sum() / n
    return _run(fn, img, txt, scale, bias, loss == "siglip")


def _assert_close(ours, ref, lowp=None, what=""):
    for key, r in ref.items():
        o = ours[key]
        err = (o - r).abs().max().item()
        scale_ = max(r.abs().max().item(), 1.0)
        if lowp is None:
            assert err <= 1e-5 * scale_, f"{what} {key}: |err| {err:.3e} > 1e-5 * {scale_:.3g}"
        else:
            torch_err = (lowp[key] - r).abs().max().item()
            # atol: fp32 rounding of the logits (size ~scale) where torch's error happens to be 0
            assert err <= 2 * torch_err + 2e-5 * scale_, (
                f"{what} {key}: ours {err:.3e} vs torch {torch_err:.3e}")


def _check(impl, b, d, dtype, loss="clip", eps=0.0, block=0, **kw):
    img, txt, scale, bias = _inputs(b, d, dtype, seed=b * 31 + d, **kw)
    ours = _run(lambda i, t, s, bb: contrastive_loss(
        i, t, s, bb, loss=loss, impl=impl, label_smoothing=eps, block_m=block, block_n=block,
        triton_interpret=(impl == "triton")), img, txt, scale, bias, loss == "siglip")
    ref = _reference(img, txt, scale, bias, loss, eps)
    lowp = None if dtype == torch.float32 else _torch_lowp(img, txt, scale, bias, loss, eps)
    _assert_close(ours, ref, lowp, what=f"{impl} B={b} D={d} {dtype} {loss} eps={eps} block={block}")


LOSSES = [("clip", 0.0), ("clip", 0.1), ("siglip", 0.0)]


@pytest.mark.parametrize("loss,eps", LOSSES)
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
@pytest.mark.parametrize("b,d", [(1, 5), (7, 19), (50, 64), (97, 33)])
@pytest.mark.parametrize("impl", ["naive", "chunked_torch"])
def test_torch_impls_match_reference(impl, b, d, dtype, loss, eps):
    _check(impl, b, d, dtype, loss, eps, block=16 if impl == "chunked_torch" else 0)


@pytest.mark.parametrize("loss,eps", LOSSES)
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16])
@pytest.mark.parametrize("b,d", [(1, 5), (7, 40), (45, 33), (70, 64)])
def test_triton_matches_reference(b, d, dtype, loss, eps):
    _check("triton", b, d, dtype, loss, eps)


@pytest.mark.parametrize("block", [1, 3, 16, 64, 500])
@pytest.mark.parametrize("loss,eps", LOSSES)
def test_chunked_tiles_equal_untiled(block, loss, eps):
    """Tile sizes 1, small with an uneven last tile, and >= B give the untiled result."""
    b, d = 37, 12
    img, txt, scale, bias = _inputs(b, d, torch.float32, seed=block)
    run = lambda impl, blk: _run(lambda i, t, s, bb: contrastive_loss(  # noqa: E731
        i, t, s, bb, loss=loss, impl=impl, label_smoothing=eps, block_m=blk, block_n=blk),
        img, txt, scale, bias, loss == "siglip")
    tiled, untiled = run("chunked_torch", block), run("naive", 0)
    for key in untiled:
        torch.testing.assert_close(tiled[key], untiled[key], rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("block", [16, 32])
@pytest.mark.parametrize("loss", ["clip", "siglip"])
def test_triton_explicit_tiles_and_several_bands(monkeypatch, block, loss):
    """Explicit tile sizes with an uneven last tile, and a backward split into 4+ row bands."""
    monkeypatch.setattr(triton_impl, "_band_rows", lambda m, n, d: 16)
    _check("triton", 70, 36, torch.float32, loss, 0.05 if loss == "clip" else 0.0, block=block)


def test_triton_block_must_be_power_of_two():
    img, txt, scale, _ = _inputs(8, 8, torch.float32)
    with pytest.raises(ValueError, match="power of two"):
        contrastive_loss(img, txt, scale, impl="triton", triton_interpret=True, block_m=24)


def test_matches_handwritten_openclip_loss():
    """OpenCLIP convention: logits = s I T^T, CE over rows and over columns, averaged."""
    img, txt, scale, _ = _inputs(64, 32, torch.float32, seed=3)
    img.requires_grad_()
    txt.requires_grad_()
    s = scale.clone().requires_grad_()
    logits_per_image = s * img @ txt.T
    logits_per_text = s * txt @ img.T
    labels = torch.arange(64)
    expected = (F.cross_entropy(logits_per_image, labels) + F.cross_entropy(logits_per_text, labels)) / 2
    exp_grads = torch.autograd.grad(expected * 0.5, (img, txt, s))
    for impl in ("naive", "chunked_torch", "triton"):
        got = contrastive_loss(img, txt, s, impl=impl, triton_interpret=True, block_m=16 if impl == "chunked_torch" else 0)
        grads = torch.autograd.grad(got * 0.5, (img, txt, s))
        torch.testing.assert_close(got, expected, rtol=1e-5, atol=1e-6)
        for g, e in zip(grads, exp_grads):
            torch.testing.assert_close(g, e, rtol=1e-4, atol=1e-6)


@pytest.mark.parametrize("impl", ["chunked_torch", "triton"])
def test_exact_max_fallback_on_overflowing_shift(impl, caplog):
    """Unnormalised features whose off-diagonal logits exceed the diagonal by >> 88 overflow the
    diagonal shift; the op must notice and recompute with exact maxima."""
    img, txt, scale, bias = _inputs(20, 8, torch.float32, seed=5, scale=30.0, normalise=False)
    img[3] = 4 * txt[7]  # S_3,7 = 30 * 16 |t7|^2, far above S_3,3
    with caplog.at_level(logging.WARNING):
        ours = _run(lambda i, t, s, b: contrastive_loss(i, t, s, impl=impl, triton_interpret=True),
                    img, txt, scale, bias, False)
    assert "exact maxima" in caplog.text
    ref = _reference(img, txt, scale, bias, "clip", 0.0)
    for key in ref:
        torch.testing.assert_close(ours[key], ref[key], rtol=1e-4, atol=1e-4)
    assert math.isfinite(ours["loss"].item())


def test_zero_dim_and_shape_one_scale_both_work():
    img, txt, scale, _ = _inputs(9, 6, torch.float32)
    a = contrastive_loss(img, txt, scale.reshape(()))
    b = contrastive_loss(img, txt, scale.reshape(1))
    assert torch.equal(a, b)
    s0 = scale.reshape(()).clone().requires_grad_()
    contrastive_loss(img, txt, s0).backward()
    assert s0.grad.shape == ()


@pytest.mark.parametrize("bad,match", [
    (lambda i, t, s: (i, t[:-1], s), "differ in shape"),
    (lambda i, t, s: (i[:, None], t, s), "2-D"),
    (lambda i, t, s: (i, t.double(), s), "differ in dtype"),
    (lambda i, t, s: (i.double(), t.double(), s), "float32, bfloat16 or float16"),
    (lambda i, t, s: (i, t, torch.ones(2)), "exactly one element"),
    (lambda i, t, s: (i, t, torch.ones(1, device="meta")), "logit_scale is on meta"),
    (lambda i, t, s: (i[:0], t[:0], s), "empty batch"),
])
def test_bad_input_errors(bad, match):
    img, txt, scale, _ = _inputs(6, 4, torch.float32)
    with pytest.raises((ValueError, TypeError), match=match):
        contrastive_loss(*bad(img, txt, scale))


@pytest.mark.parametrize("which", ["image_features", "text_features", "logit_scale"])
def test_non_finite_input_is_named(which):
    img, txt, scale, _ = _inputs(6, 4, torch.float32)
    args = {"image_features": img, "text_features": txt, "logit_scale": scale}
    args[which] = args[which].clone()
    args[which].view(-1)[0] = float("nan")
    with pytest.raises(FloatingPointError, match=which):
        contrastive_loss(args["image_features"], args["text_features"], args["logit_scale"])


def test_siglip_needs_bias_and_unknown_names_fail():
    img, txt, scale, _ = _inputs(6, 4, torch.float32)
    with pytest.raises(ValueError, match="logit_bias"):
        contrastive_loss(img, txt, scale, loss="siglip")
    with pytest.raises(ConfigError, match="unknown contrastive_loss impl 'cuda_magic'"):
        contrastive_loss(img, txt, scale, impl="cuda_magic")
    with pytest.raises(ValueError, match="unknown loss"):
        contrastive_loss(img, txt, scale, loss="triplet")


def test_config_section_errors_name_key_and_file():
    with pytest.raises(ConfigError, match=r"run\.json.*unknown key 'impll'.*did you mean 'impl'"):
        ContrastiveLossConfig.from_dict({"impll": "triton"}, source="run.json")
    with pytest.raises(ConfigError, match="'impl' must be one of"):
        ContrastiveLossConfig.from_dict({"impl": "fast"})
    with pytest.raises(ConfigError, match="label_smoothing"):
        ContrastiveLossConfig.from_dict({"label_smoothing": 1.5})
    with pytest.raises(ConfigError, match="must be an integer"):
        ContrastiveLossConfig.from_dict({"block_m": "64"})
    cfg = ContrastiveLossConfig.from_dict({"loss": "siglip", "impl": "chunked_torch", "block_m": 8})
    assert cfg.loss == "siglip" and cfg.block_m == 8


def test_module_reports_what_ran_on_cpu(caplog):
    img, txt, scale, _ = _inputs(12, 8, torch.float32)
    crit = ContrastiveLoss(ContrastiveLossConfig(impl="triton"))
    with caplog.at_level(logging.WARNING):
        loss = crit(img, txt, scale)
    assert crit.resolved_impl == "chunked_torch"
    assert "not on CUDA" in crit.resolved_reason and "not on CUDA" in caplog.text
    torch.testing.assert_close(loss, contrastive_loss_reference(img, txt, scale), rtol=1e-5, atol=1e-6)
    interp = ContrastiveLoss(ContrastiveLossConfig(impl="triton", triton_interpret=True))
    torch.testing.assert_close(interp(img, txt, scale), loss, rtol=1e-5, atol=1e-6)
    assert interp.resolved_impl == "triton"
    assert ContrastiveLoss(impl="auto")(img, txt, scale) is not None
    assert ops.resolve_impl("auto", torch.device("cpu"))[0] == "chunked_torch"


def test_registered_op_passes_opcheck_and_compiles():
    img, txt, scale, bias = _inputs(10, 6, torch.float32)
    args = (img.requires_grad_(), txt.requires_grad_(), scale.requires_grad_(), None, "clip",
            "chunked_torch", 0.0, 4, 4, False)
    torch.library.opcheck(torch.ops.infclip.contrastive_loss.default, args)
    sig_args = (img, txt, scale, bias.requires_grad_(), "siglip", "naive", 0.0, 0, 0, False)
    torch.library.opcheck(torch.ops.infclip.contrastive_loss.default, sig_args)

    def step(i, t, s):
        return torch.ops.infclip.contrastive_loss(i, t, s, None, "clip", "chunked_torch", 0.0, 4, 4, False)[0]

    compiled = torch.compile(step, fullgraph=True, backend="aot_eager")
    out = compiled(img, txt, scale)
    out.backward()
    torch.testing.assert_close(out, contrastive_loss_reference(img, txt, scale), rtol=1e-5, atol=1e-6)
    assert img.grad is not None and scale.grad is not None
