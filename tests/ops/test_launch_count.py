"""The single-device triton impl's launches per call, and the backward's numbers bit for bit.

At small B (1,024-2,048 on an H200) the op's GPU time is set by how many kernels it launches,
not by their work, so the launches of one forward + backward are counted here on the CPU (the
Triton kernels through the interpreter; the cuBLAS GEMMs, which the CPU path runs as several torch
ops, count one each) against a fixed maximum. The backward's scaling by the upstream gradient is
one Triton launch; its results must equal the torch formula it replaced, bit for bit.
"""

import pytest
import torch
import torch.nn.functional as F
from torch.profiler import ProfilerActivity, profile, record_function
from triton.runtime.interpreter import InterpretedFunction

import infclip.ops.contrastive_loss_triton as tri
from infclip.ops import contrastive_loss
from infclip.ops.registered import OP, OP_BACKWARD

UPSTREAM = 0.37  # a gradient of the loss that is not 1 (and not a power of 2)

# aten ops that launch no kernel (allocations, views, no-op conversions)
_NO_KERNEL = {
    "aten::empty", "aten::empty_like", "aten::empty_strided", "aten::new_empty", "aten::view",
    "aten::reshape", "aten::_reshape_alias", "aten::select", "aten::slice", "aten::unbind",
    "aten::detach", "detach", "aten::t", "aten::numpy_T", "aten::transpose", "aten::permute",
    "aten::expand", "aten::alias", "aten::as_strided", "aten::unsqueeze", "aten::squeeze",
    "aten::resolve_conj", "aten::resolve_neg", "aten::lift_fresh", "aten::contiguous",
    "aten::to", "aten::_to_copy", "aten::clone", "aten::result_type", "aten::size",
    "aten::stride", "aten::numel",
}

# The maxima, with what they are: SigLIP takes its gradients in the forward. Forward: the launch
# that zeroes the row sums (and writes the coefficient s / B), the fused gradient kernel, the two
# GEMMs G T and G^T I, the finishing launch (loss, sum G S', sum G); backward: one launch scales
# both gradients by the upstream gradient and writes d_scale and d_bias. 6 (it was 15: three
# reductions, a stack, a fill for the coefficient, the loss's division, and in the backward a
# division, two products for the gradients and two for the scalars).
SIGLIP_MAX = 6
# CLIP with S' kept from forward to backward (fp32, small B). Forward: prologue (also zeroes the
# statistics sums), shifts, the GEMM for S', both statistics passes in one launch, epilogue;
# backward: the gradient kernel on the kept S' and two GEMMs. 8 (it was 11: a zero fill, the
# statistics passes as two launches, and a division of g in the backward that nothing read).
CLIP_MAX = 8


@pytest.fixture
def launches(monkeypatch):
    """Names a Triton launch "triton::<kernel>" and a GEMM helper call "gemm" in the profile."""
    run = InterpretedFunction.run

    def named_run(self, *args, **kwargs):
        with record_function("triton::" + self.fn.__name__):
            return run(self, *args, **kwargs)

    monkeypatch.setattr(InterpretedFunction, "run", named_run)
    for name in ("_logits", "_mm", "_mm_into", "_addmm_"):
        def gemm(*args, _f=getattr(tri, name), **kwargs):
            with record_function("gemm"):
                return _f(*args, **kwargs)
        monkeypatch.setattr(tri, name, gemm)
    return _count


def _launched(event) -> list:
    """The launches under a profiler event: Triton kernels, GEMMs, and the outermost aten ops
    that launch a kernel (looked into when they launch none themselves, e.g. a clone's copy)."""
    name = event.name
    if name == "gemm" or name.startswith("triton::"):
        return [name]
    if name.startswith("aten::") and name not in _NO_KERNEL:
        return [name]
    return [n for child in event.cpu_children for n in _launched(child)]


def _inputs(b, d, dtype, seed=0):
    g = torch.Generator().manual_seed(seed)
    img = F.normalize(torch.randn(b, d, generator=g, dtype=torch.float64), dim=-1)
    txt = F.normalize(img + 0.8 * torch.randn(b, d, generator=g, dtype=torch.float64), dim=-1)
    return (img.to(dtype).requires_grad_(), txt.to(dtype).requires_grad_(),
            torch.tensor([14.3], requires_grad=True), torch.tensor([-3.0], requires_grad=True))


def _count(loss, dtype=torch.float32, **kw) -> dict:
    """{"forward": [...], "backward": [...]}: the launches of one call and its backward."""
    img, txt, scale, bias = _inputs(64, 32, dtype)
    args = (img, txt, scale, bias if loss == "siglip" else None)
    kw = dict(loss=loss, impl="triton", triton_interpret=True, **kw)
    contrastive_loss(*args, **kw).backward()  # the kernels' first runs outside the profile
    for leaf in (img, txt, scale, bias):
        leaf.grad = None  # (accumulating into a gradient is autograd's launch, not the op's)
    upstream = torch.tensor(UPSTREAM)  # (made here: autograd's fill of ones is not the op's)
    with profile(activities=[ProfilerActivity.CPU]) as prof:
        with record_function("forward"):
            out = contrastive_loss(*args, **kw)
        with record_function("backward"):
            out.backward(upstream)
    return {e.name: [n for c in e.cpu_children for n in _launched(c)]
            for e in prof.events() if e.name in ("forward", "backward")}


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16])
def test_siglip_launches_per_call(launches, dtype):
    got = launches("siglip", dtype)
    assert len(got["forward"]) + len(got["backward"]) <= SIGLIP_MAX, got
    assert got["backward"] == ["triton::_scale_grads_kernel"], got


@pytest.mark.parametrize("budget", [64.0, 0.0])  # S' kept; recomputed by the fused kernels
def test_clip_launches_per_call(launches, budget):
    got = launches("clip", logits_budget_mb=budget)
    assert len(got["forward"]) + len(got["backward"]) <= CLIP_MAX, got
    assert not [n for n in got["forward"] + got["backward"] if n.startswith("aten::")], got
    fp16 = launches("clip", torch.float16, logits_budget_mb=budget)  # + the scaling launch
    assert len(fp16["forward"]) + len(fp16["backward"]) <= CLIP_MAX + 1, fp16


# ----------------------------------------------------------------------------------------------
# The backward's numbers: the torch formula the scaling launch replaced, bit for bit
# ----------------------------------------------------------------------------------------------
def _siglip_backward_formula(g, s, d_img, d_txt, sums, n, folded, dtype):
    """The SigLIP backward's last step written out in torch (one device): the saved gradients
    times g (folded) or g s / B, the scale and bias gradients from the sums, and the registered
    backward's cast to the features' dtype."""
    coef = g / n
    k = g if folded else coef * s
    return (d_img * k).to(dtype), (d_txt * k).to(dtype), coef * sums[0], coef * sums[1]


def _siglip_backward_op(g, img, txt, scale, bias, d_img, d_txt, sums):
    empty = img.new_empty(0)
    return OP_BACKWARD(g, img, txt, scale, bias, d_img, d_txt, sums, empty, "siglip", "triton",
                       0.0, 0, 0, False)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16, torch.float32])
def test_siglip_backward_matches_the_formula_bit_for_bit(dtype):
    """The backward op on what a forward saved (bf16: as the GPU forward would save it; the
    interpreter cannot run bf16 dots): finished gradients in the features' dtype times g
    (bf16, fp32), or fp32 gradients times g s / B (fp16); fp32 products rounded once."""
    b, d = 40, 24
    gen = torch.Generator().manual_seed(3)
    folded = dtype != torch.float16
    saved = dtype if folded else torch.float32
    d_img = (torch.randn(b, d, generator=gen) * 1e-2).to(saved)
    d_txt = (torch.randn(b, d, generator=gen) * 1e-2).to(saved)
    sums = torch.randn(2, generator=gen)
    img, txt, scale, bias = (x.detach() for x in _inputs(b, d, dtype))
    g = torch.tensor(UPSTREAM)
    got = _siglip_backward_op(g, img, txt, scale, bias, d_img, d_txt, sums)
    want = _siglip_backward_formula(g, scale.reshape(()), d_img, d_txt, sums, b, folded, dtype)
    for x, y, what in zip(got, want, ("d_img", "d_txt", "d_scale", "d_bias")):
        assert x.dtype == y.dtype and torch.equal(x.reshape(y.shape), y), what


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16])
def test_siglip_autograd_matches_the_formula_bit_for_bit(dtype):
    """Through autograd, (loss * 0.37).backward() twice with retain_graph: each gives the formula
    on the forward's own results (so the saved tensors were not changed in place)."""
    img, txt, scale, bias = _inputs(48, 24, dtype, seed=5)
    kw = ("siglip", "triton", 0.0, 0, 0, False, 64.0, True)
    with torch.no_grad():
        _, d_img, d_txt, sums, _ = OP(img, txt, scale, bias, *kw)
    want = _siglip_backward_formula(torch.tensor(UPSTREAM), scale.detach().reshape(()), d_img,
                                     d_txt, sums, 48, dtype != torch.float16, dtype)
    loss = contrastive_loss(img, txt, scale, bias, loss="siglip", impl="triton",
                            triton_interpret=True)
    leaves = (img, txt, scale, bias)
    for times in (1, 2):
        (loss * UPSTREAM).backward(retain_graph=True)
        for leaf, w in zip(leaves, want):
            assert torch.equal(leaf.grad.reshape(w.shape), times * w)  # (x + x: exact)


def test_clip_fp16_backward_matches_the_formula_bit_for_bit():
    """CLIP with fp16 features (the coefficients are not folded into the gradient kernel there):
    the fp32 gradients times k = g / (2B) s in fp32, then rounded to fp16; d_scale = g / (2B)
    times the forward's sum of E[S'] - S'_ii terms."""
    b = 40
    img, txt, scale, _ = _inputs(b, 24, torch.float16, seed=9)
    kw = ("clip", "triton", 0.0, 0, 0, False, 64.0)
    with torch.no_grad():
        _, row_lse, col_lse, aux, kept = OP(img, txt, scale, None, *kw)
        d_img, d_txt = tri.clip_grads_triton(img, txt, scale, row_lse, col_lse, aux[:b],
                                             diag_value=2.0, logits=kept)
    g = torch.tensor(UPSTREAM)
    coef = g / (2 * b)
    k = coef * scale.detach().reshape(())
    want = (d_img.mul_(k).half(), d_txt.mul_(k).half(), coef * aux[b])
    loss = contrastive_loss(img, txt, scale, loss="clip", impl="triton", triton_interpret=True)
    (loss * UPSTREAM).backward()
    for leaf, w in zip((img, txt, scale), want):
        assert torch.equal(leaf.grad.reshape(w.shape), w)
