"""GPU tests of the warp-specialised Gluon kernels (ops/gluon_kernels.py; an H100 / H200 only).
Over awkward shapes (rows and columns not multiples of their tiles, a feature width not a multiple
of their K chunk), positives off the main diagonal or outside the block, both dtypes and every
flag, the CLIP and SigLIP gradient kernels write the Triton kernels' P bit for bit and their sums
(d scale; SigLIP's row sums and pair losses) up to the order of the fp32 atomic sums, and the
forward's column-strip sums match the Triton strip kernel's; the op takes each kernel and gives
the same loss and gradients as with the Triton kernels, and falls back to them, with a warning,
when a kernel's first launch fails."""

import logging

import pytest
import torch
import torch.nn.functional as F

import infclip.ops.contrastive_loss_triton as tri
from infclip.ops import contrastive_loss, gluon_kernels
from infclip.ops.tuning import TUNING, tuning

pytestmark = pytest.mark.gpu

if not torch.cuda.is_available() or torch.cuda.get_device_capability() != (9, 0):
    pytest.skip("needs an sm_90 GPU (H100 / H200)", allow_module_level=True)
if gluon_kernels.available():
    pytest.skip(f"this Triton has no Gluon for Hopper: {gluon_kernels.available()}", allow_module_level=True)


def _block(m, n, d, dtype, seed):
    g = torch.Generator(device="cuda").manual_seed(seed)
    a = F.normalize(torch.randn(m, d, device="cuda", generator=g), dim=-1).to(dtype)
    b = F.normalize(torch.randn(n, d, device="cuda", generator=g), dim=-1).to(dtype)
    rows = torch.randn(m, device="cuda", generator=g) + 3.0
    cols = torch.randn(n, device="cuda", generator=g) + 3.0
    ref = torch.randn(max(m, n), device="cuda", generator=g) * 0.1
    return a, b, rows, cols, ref


def _features(b: int):
    """Image and text features [b, 768] (bf16, unit rows, positives correlated)."""
    g = torch.Generator(device="cuda").manual_seed(b)
    img = F.normalize(torch.randn(b, 768, device="cuda", generator=g), dim=-1).bfloat16()
    txt = F.normalize(img.float() + torch.randn(b, 768, device="cuda", generator=g), dim=-1).bfloat16()
    return img, txt


def _loss_and_grads(img, txt, loss: str) -> list:
    """[loss, d img, d txt, d scale(, d bias)] of one eager call of the op (a CUDA-graph replay
    would rerun its first capture, whatever the kernels' switches say since)."""
    leaves = [img.clone().requires_grad_(), txt.clone().requires_grad_(),
              torch.full((), 20.0 if loss == "clip" else 10.0, device="cuda", requires_grad=True)]
    if loss == "siglip":
        leaves.append(torch.full((), -10.0, device="cuda", requires_grad=True))
    out = contrastive_loss(*leaves, loss=loss, impl="triton", graph_max_batch=0)
    out.backward()
    return [out.detach()] + [x.grad for x in leaves]


def _op_with_and_without(b, switch: str, launch: str, monkeypatch, loss="clip"):
    """The op's loss and gradients at B = ``b`` with the Gluon kernel of ``switch`` (a TUNING
    field: gluon_grad, gluon_sums, gluon_siglip) on and off; asserts that
    gluon_kernels.``launch`` ran exactly when on (no failover to the Triton kernel)."""
    calls = []
    real = getattr(gluon_kernels, launch)
    monkeypatch.setattr(gluon_kernels, launch, lambda *a, **k: (calls.append(1), real(*a, **k))[1])
    img, txt = _features(b)
    results = []
    for on in (True, False):
        monkeypatch.setattr(TUNING, switch, on)
        results.append(_loss_and_grads(img, txt, loss))
        assert getattr(TUNING, switch) == on and (len(calls) > 0) == on
        calls.clear()
    return results


@pytest.mark.parametrize("state,launch,loss,b", [("gluon_grad", "clip_grad_block", "clip", 8192),
                                                 ("gluon_sums", "clip_sums", "clip", 12288),
                                                 ("gluon_siglip", "siglip_grad_block", "siglip", 8192)])
def test_a_failed_first_launch_falls_back_to_the_triton_kernel(state, launch, loss, b, monkeypatch, caplog):
    """A Gluon kernel whose first launch fails (a Triton whose Gluon differs fails at its first
    build) turns itself off with one warning that says why, the same call finishes with the Triton
    kernel's results, and the other Gluon kernels stay on."""
    switches = ("gluon_grad", "gluon_sums", "gluon_siglip")
    for switch in switches:
        monkeypatch.setattr(TUNING, switch, True)

    def broken(*args, **kwargs):
        raise RuntimeError("out of resource: shared memory, Required: 233584")

    monkeypatch.setattr(gluon_kernels, launch, broken)
    img, txt = _features(b)
    with caplog.at_level(logging.WARNING, logger=tri.log.name):
        got = _loss_and_grads(img, txt, loss)
    assert {name: getattr(TUNING, name) for name in switches} == {name: name != state for name in switches}
    warned = [r.getMessage() for r in caplog.records if r.name == tri.log.name and r.levelno >= logging.WARNING]
    assert len(warned) == 1, warned
    assert "Gluon" in warned[0] and "Triton" in warned[0] and "out of resource" in warned[0]
    want = _loss_and_grads(img, txt, loss)  # (the kernel off by now: the Triton kernel's path)
    torch.testing.assert_close(got[0], want[0], rtol=1e-6, atol=0)
    for g, w in zip(got[1:], want[1:]):
        torch.testing.assert_close(g.float(), w.float(), rtol=2 ** -7, atol=1e-6)


def _both(a, b, rows, cols, ref, diag, coef_scale, dscale):
    """(P, d scale) by the Gluon kernel and by the Triton kernel, same arguments."""
    m, n = a.shape[0], b.shape[0]
    scale = torch.full((1,), 14.0, device="cuda")
    coef = torch.full((1,), 0.37, device="cuda")
    src = torch.full((1,), -2.5, device="cuda")
    out = []
    for use_gluon in (True, False):
        p = torch.full((m, n), float("nan"), device="cuda", dtype=a.dtype)
        dst = torch.zeros((), device="cuda")
        args = (scale, coef, 1.5, src, dst, rows, cols, ref[:m], ref[:n], diag, 2.0, 0.25, coef_scale, dscale)
        if use_gluon:
            assert tri._gluon_grad(tri._GLUON, a, b, p, args), "the Gluon kernel did not take the block"
        else:
            tri._fused(tri._clip_grad_fused_kernel, a, b, "grad", False, *args, p=p)
        out.append((p, dst))
    return out


def test_a_pdl_launch_waits_for_the_kernel_before_it():
    """Launched with programmatic dependent launch (TUNING.gluon_grad_pdl), a gradient block's programs start
    while the kernel before it drains. They must still read what that kernel wrote (features copied
    in just before the launch) and leave P alone until that kernel has read it (the previous
    block's GEMM of P, then a block of other values), eagerly and replayed in a CUDA graph: each P
    the Triton kernel's, the GEMM's result that of the first P."""
    assert TUNING.gluon_grad_pdl
    a_src, b, rows, cols, ref = _block(4096, 4096, 768, torch.bfloat16, 11)
    scale, src = torch.full((1,), 14.0, device="cuda"), torch.full((1,), -2.5, device="cuda")
    coefs = [torch.full((1,), c, device="cuda") for c in (0.37, -1.25)]

    def args(coef):
        return (scale, coef, 1.5, src, torch.zeros((), device="cuda"), rows, cols, ref, ref, 0, 2.0, 0.25, True, 1)

    want = []
    for coef in coefs:
        want.append(torch.empty(4096, 4096, device="cuda", dtype=torch.bfloat16))
        tri._fused(tri._clip_grad_fused_kernel, a_src, b, "grad", False, *args(coef), p=want[-1])
    want_gemm = torch.mm(want[0], b)
    a = torch.zeros_like(a_src)
    p = torch.full_like(want[0], float("nan"))
    gemm = torch.zeros_like(want_gemm)

    def blocks():
        a.copy_(a_src)  # (the kernel right before the first block writes its A)
        assert tri._gluon_grad(tri._GLUON, a, b, p, args(coefs[0]))
        torch.mm(p, b, out=gemm)  # (the second block must not write P before this GEMM has read it)
        assert tri._gluon_grad(tri._GLUON, a, b, p, args(coefs[1]))

    blocks()
    torch.cuda.synchronize()
    assert torch.equal(gemm, want_gemm) and torch.equal(p, want[1])
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        blocks()
    for _ in range(3):
        a.zero_()
        p.fill_(float("nan"))
        gemm.zero_()
        graph.replay()
        torch.cuda.synchronize()
        assert torch.equal(gemm, want_gemm) and torch.equal(p, want[1])


# (columns a multiple of 8: P's rows must be 16-byte aligned for its store by the copy engine)
@pytest.mark.parametrize("m,n,d", [(3001, 2904, 200), (4096, 2312, 768), (2944, 3080, 96)])
@pytest.mark.parametrize("diag", [0, 37, -5000])
def test_gluon_block_equals_the_triton_kernel(m, n, d, diag):
    a, b, rows, cols, ref = _block(m, n, d, torch.bfloat16, m + diag)
    (p, dst), (want, want_dst) = _both(a, b, rows, cols, ref, diag, True, 2)
    assert torch.equal(p, want)
    torch.testing.assert_close(dst, want_dst, rtol=1e-5, atol=0)


@pytest.mark.parametrize("m,n,d", [(4096, 2304, 768), (2944, 3072, 200), (1024, 8192, 96)])
@pytest.mark.parametrize("side", ["below", "above"])
@pytest.mark.parametrize("dtype,coef_scale,dscale", [(torch.bfloat16, True, 2), (torch.bfloat16, True, 1),
                                                     (torch.float16, False, 0)])
def test_gluon_plain_block_equals_the_triton_kernel(m, n, d, side, dtype, coef_scale, dscale):
    """A block with no positive in whole 128 x 128 tiles (the op's off-diagonal blocks) goes to
    _clip_grad_ws_kernel with PLAIN, whose P is the Triton kernel's bit for bit and its d scale the
    same up to the atomic sums' order."""
    diag = m + 3 if side == "above" else -n - 5
    assert gluon_kernels.plain_block(m, n, diag)
    a, b, rows, cols, ref = _block(m, n, d, dtype, m + n + d)
    (p, dst), (want, want_dst) = _both(a, b, rows, cols, ref, diag, coef_scale, dscale)
    assert torch.equal(p, want)
    if dscale:
        torch.testing.assert_close(dst, want_dst, rtol=1e-5, atol=0)


@pytest.mark.parametrize("dtype,coef_scale,dscale", [(torch.bfloat16, True, 1), (torch.float16, False, 0),
                                                     (torch.float16, True, 2)])
def test_gluon_block_flags_and_dtypes(dtype, coef_scale, dscale):
    a, b, rows, cols, ref = _block(3001, 3000, 256, dtype, 7)
    (p, dst), (want, want_dst) = _both(a, b, rows, cols, ref, 0, coef_scale, dscale)
    assert torch.equal(p, want)
    if dscale:
        torch.testing.assert_close(dst, want_dst, rtol=1e-5, atol=0)


@pytest.mark.parametrize("b", [8192, 12288, 32768])
def test_op_backward_takes_it(b, monkeypatch):
    """The op's CLIP backward with the Gluon block and with the Triton block: the same loss and
    gradients (up to the atomic sums' order); at 32k most of its blocks hold no positive and take
    the plain kernel."""
    with_it, without = _op_with_and_without(b, "gluon_grad", "clip_grad_block", monkeypatch)
    for got, want in zip(with_it, without):
        torch.testing.assert_close(got.float(), want.float(), rtol=2 ** -7, atol=1e-6)


def _strip_sums(a, b, rows, cols, diag, use_gluon: bool, **order):
    """(row sums, column sums) of the forward's column strips, by the Gluon kernel (``order``: its
    launch_logits and rotate) or by the Triton strip kernel, same arguments."""
    scale = torch.full((1,), 14.0, device="cuda")
    row_sum = torch.zeros(a.shape[0], device="cuda")
    col_sum = torch.zeros(b.shape[0], device="cuda")
    if use_gluon:
        gluon_kernels.clip_sums(a, b, scale, rows, cols, row_sum, col_sum, diag, tri._sm_count(a.device), **order)
    else:
        with tuning(gluon_sums=False):
            tri._clip_sums_strips(a, b, scale, rows, cols, row_sum, col_sum, diag, False)
    return row_sum, col_sum


@pytest.mark.parametrize("m,n,d", [(3001, 2904, 200), (4096, 2312, 768), (2944, 3080, 96), (65, 130, 64)])
@pytest.mark.parametrize("diag", [0, 37, -5000, 2999])
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_gluon_sums_equal_the_triton_strips(m, n, d, diag, dtype):
    """The warp-specialised forward sums against the Triton strip kernel over rows and columns
    past its tiles, a feature width that is not a multiple of its K chunk, positives off the
    diagonal, in a corner or outside the block, both 16-bit dtypes: every row and column sum
    within the fp32 atomics' order (the positives left out: a sum that kept one would be ~e^14
    larger)."""
    a, b, rows, cols, _ref = _block(m, n, d, dtype, m + n + diag)
    got = _strip_sums(a, b, rows, cols, diag, True)
    want = _strip_sums(a, b, rows, cols, diag, False)
    for g, w in zip(got, want):
        assert torch.isfinite(g).all()
        torch.testing.assert_close(g, w, rtol=2e-6, atol=0)


@pytest.mark.parametrize("diag", [0, 2100, -37, 4999])
@pytest.mark.parametrize("launch_logits,rotate", [(1, False), (1, True), (0, True), (6000 * 4500, False)])
def test_gluon_sums_over_row_slabs_and_rotated_equal_the_triton_strips(diag, launch_logits, rotate):
    """The sums in launches over slabs of A's rows (launch_logits 1: slabs of one item's rows,
    2,048, the last one short; 6000 x 4500: two slabs of 4,096 and 904 rows), each program's row
    tiles taken from its own offset on (rotate), and both, against the Triton strip kernel: the
    positives found across the slabs' row offsets, every sum within the atomics' order."""
    a, b, rows, cols, _ref = _block(5000, 6000, 256, torch.bfloat16, 11 + abs(diag))
    got = _strip_sums(a, b, rows, cols, diag, True, launch_logits=launch_logits, rotate=rotate)
    want = _strip_sums(a, b, rows, cols, diag, False)
    for g, w in zip(got, want):
        torch.testing.assert_close(g, w, rtol=2e-6, atol=0)


@pytest.mark.parametrize("diag", [0, 64, 100, -2048, -4032, 8191, 9000])
@pytest.mark.parametrize("rotate", [False, True])
def test_gluon_sums_in_whole_tiles_equal_the_triton_strips(diag, rotate):
    """Rows and columns in whole tiles, so most items take the epilogue without the select (no positive
    among their rows): positives on tile edges, inside tiles, in the last rows, or none in the block;
    every sum against the Triton strip kernel's (an item wrongly taken as plain would keep a positive:
    its sums ~e^14 larger)."""
    a, b, rows, cols, _ref = _block(8192, 4096, 128, torch.bfloat16, 21 + abs(diag))
    got = _strip_sums(a, b, rows, cols, diag, True, rotate=rotate)
    want = _strip_sums(a, b, rows, cols, diag, False)
    for g, w in zip(got, want):
        torch.testing.assert_close(g, w, rtol=2e-6, atol=0)


def test_gluon_sums_leave_out_exactly_the_positives():
    """Against the sums written out in fp64 from the same logits (rounded as the kernels' fp32
    accumulators hold them): the positives i - j == diag and nothing else left out."""
    m, n, d, diag = 700, 900, 128, -40
    a, b, rows, cols, _ref = _block(m, n, d, torch.bfloat16, 3)
    got_rows, got_cols = _strip_sums(a, b, rows, cols, diag, True)
    s = (a.float() @ b.float().T).double() * 14.0
    keep = (torch.arange(m, device="cuda")[:, None] - torch.arange(n, device="cuda")[None, :]) != diag
    want_rows = torch.where(keep, (s - rows.double()[:, None]).exp(), 0.0).sum(1)
    want_cols = torch.where(keep, (s - cols.double()[None, :]).exp(), 0.0).sum(0)
    torch.testing.assert_close(got_rows.double(), want_rows, rtol=1e-4, atol=0)
    torch.testing.assert_close(got_cols.double(), want_cols, rtol=1e-4, atol=0)


@pytest.mark.parametrize("b", [12288, 16384 + 136])
def test_op_forward_takes_the_gluon_sums(b, monkeypatch):
    """The op's CLIP forward at sizes where it takes the column strips, with the Gluon sums and with
    the Triton strip kernel: the same loss and gradients."""
    assert b * b >= TUNING.strips_min_logits
    with_it, without = _op_with_and_without(b, "gluon_sums", "clip_sums", monkeypatch)
    torch.testing.assert_close(with_it[0], without[0], rtol=1e-6, atol=0)
    for got, want in zip(with_it[1:], without[1:]):
        torch.testing.assert_close(got.float(), want.float(), rtol=2 ** -7, atol=1e-6)


def _siglip_both(a, b, diag, coef_scale, bias=-4.0):
    """(P, sums [3, M]: G S', G, the pair losses) by the Gluon SigLIP kernel and by the Triton
    kernel with the pair losses, same arguments."""
    m, n = a.shape[0], b.shape[0]
    scale = torch.full((1,), 14.0, device="cuda")
    bias_t = torch.full((1,), bias, device="cuda")
    coef = torch.full((1,), 0.37, device="cuda")
    out = []
    for use_gluon in (True, False):
        p = torch.full((m, n), float("nan"), device="cuda", dtype=a.dtype)
        sums = torch.zeros(3, m, device="cuda")
        args = (scale, bias_t, coef, sums[1], sums[0], sums[2], diag, coef_scale)
        if use_gluon:
            assert tri._gluon_grad(tri._GLUON_SIGLIP, a, b, p, args), "the Gluon kernel did not take the block"
        else:
            tri._fused(tri._siglip_grad_fused_kernel, a, b, "siglip_grad_loss", False, *args, True, p=p)
        out.append((p, sums))
    return out


# (at least TUNING.tma_min_logits logits: smaller blocks take the Triton kernel)
@pytest.mark.parametrize("m,n,d", [(3001, 2904, 200), (4096, 2312, 768), (2944, 3080, 96), (1100, 8200, 64)])
@pytest.mark.parametrize("diag", [0, 37, -5000])
def test_gluon_siglip_block_equals_the_triton_kernel(m, n, d, diag):
    """P bit for bit; G's row sums, G S''s and the pair losses' within the fp32 atomics' order."""
    a, b, *_ = _block(m, n, d, torch.bfloat16, m + n + diag)
    (p, sums), (want, want_sums) = _siglip_both(a, b, diag, True)
    assert torch.equal(p, want)
    assert torch.isfinite(sums).all() and sums[2].min() > 0
    torch.testing.assert_close(sums, want_sums, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("m,n,d", [(4096, 2304, 768), (2944, 3072, 200), (1024, 8192, 96)])
@pytest.mark.parametrize("side", ["below", "above"])
@pytest.mark.parametrize("dtype,coef_scale,bias", [(torch.bfloat16, True, -4.0), (torch.float16, False, 2.5)])
def test_gluon_siglip_plain_block_equals_the_triton_kernel(m, n, d, side, dtype, coef_scale, bias):
    """A block with no positive in whole tiles (the op's off-diagonal blocks) takes the SigLIP kernel's
    epilogue without the labels' and bounds' selects: P still the Triton kernel's bit for bit, the
    sums the same up to the atomics' order."""
    diag = m + 3 if side == "above" else -n - 5
    assert gluon_kernels.plain_block(m, n, diag, tiles=gluon_kernels.GRAD_TILES)
    a, b, *_ = _block(m, n, d, dtype, m + n + d)
    (p, sums), (want, want_sums) = _siglip_both(a, b, diag, coef_scale, bias=bias)
    assert torch.equal(p, want)
    assert torch.isfinite(sums).all() and sums[2].min() > 0
    torch.testing.assert_close(sums, want_sums, rtol=1e-5, atol=1e-6)


def test_gluon_siglip_plain_block_pair_losses_are_nan_where_the_triton_kernels_are():
    """The plain epilogue keeps the NaN rules: a non-finite feature makes its row's pair losses NaN
    (only its row's), a NaN bias every row's."""
    a, b, *_ = _block(3072, 3072, 128, torch.bfloat16, 6)  # (2^23 logits or more: TUNING.tma_min_logits)
    a[17, 3] = float("inf")
    (_p, sums), (_want, want_sums) = _siglip_both(a, b, 5000, True)
    assert torch.equal(sums[2].isnan(), want_sums[2].isnan()) and sums[2].isnan().sum() == 1
    (_p, sums), (_want, want_sums) = _siglip_both(a[64:], b, 5000, True, bias=float("nan"))
    assert sums[2].isnan().all() and want_sums[2].isnan().all()


@pytest.mark.parametrize("dtype,coef_scale", [(torch.float16, False), (torch.float16, True), (torch.bfloat16, False)])
def test_gluon_siglip_block_flags_and_dtypes(dtype, coef_scale):
    a, b, *_ = _block(3001, 3000, 256, dtype, 11)
    (p, sums), (want, want_sums) = _siglip_both(a, b, 5, coef_scale, bias=2.5)
    assert torch.equal(p, want)
    torch.testing.assert_close(sums, want_sums, rtol=1e-5, atol=1e-6)


def test_gluon_siglip_pair_losses_are_nan_where_the_triton_kernels_are():
    """A non-finite feature makes its row's pair losses NaN (and only its row's), as in the Triton
    kernel; a NaN bias makes every row's NaN."""
    a, b, *_ = _block(3000, 3000, 128, torch.bfloat16, 5)
    a[17, 3] = float("inf")
    (_p, sums), (_want, want_sums) = _siglip_both(a, b, 0, True)
    assert torch.equal(sums[2].isnan(), want_sums[2].isnan()) and sums[2].isnan().sum() == 1
    (_p, sums), (_want, want_sums) = _siglip_both(a[18:], b, 0, True, bias=float("nan"))
    assert sums[2].isnan().all() and want_sums[2].isnan().all()


@pytest.mark.parametrize("b", [8192, 12288 + 136, 32768])
def test_op_siglip_takes_the_gluon_block(b, monkeypatch):
    """The op's SigLIP loss (its forward with the gradients in one pass) with the Gluon block and
    with the Triton block: the same loss and gradients (up to the atomic sums' order)."""
    with_it, without = _op_with_and_without(b, "gluon_siglip", "siglip_grad_block", monkeypatch, "siglip")
    torch.testing.assert_close(with_it[0], without[0], rtol=1e-6, atol=0)
    for got, want in zip(with_it[1:], without[1:]):
        torch.testing.assert_close(got.float(), want.float(), rtol=2 ** -7, atol=1e-6)