"""CPU tests of the contrastive loss op: every impl against the full-matrix reference.

Tolerances (shared/STYLE.md item 8): fp32 within 1e-5 relative of an fp64 reference; fp16 /
bf16 within 2x torch's own low-precision error on the same inputs plus a small atol. The
Triton kernels run under TRITON_INTERPRET=1 (set by tests/run.sh and conftest.py) in fp32 and
fp16 only: the interpreter cannot do bf16 dots (shared/ENVIRONMENT.md).
"""

import importlib
import logging
import math

import pytest
import torch
import torch.nn.functional as F

from infclip import ops
import infclip.ops.contrastive_loss_triton as triton_impl
from infclip.ops import kernels_common
from infclip.ops import ConfigError, ContrastiveLoss, ContrastiveLossConfig, contrastive_loss
from infclip.ops import contrastive_loss_reference
from infclip.ops.tuning import TUNING

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


@pytest.mark.parametrize("fused", [True, False])
@pytest.mark.parametrize("band", [1, 16, 32])
@pytest.mark.parametrize("loss", ["clip", "siglip"])
def test_triton_row_bands(monkeypatch, band, loss, fused):
    """Rows per backward band (block_m) of 1, 16 (an uneven last band) and 32, on the fused
    GEMM kernels and on cuBLAS bands with Triton passes: the recompute forward and backward
    (column sums and dT accumulated over bands) give the reference. D = 36 is not a multiple of
    the fused kernels' K tile. One-row bands on B = 24 (24 bands; the interpreter's time grows
    with the launches), the others on B = 70."""
    monkeypatch.setattr(TUNING, "fused_max_logits", 1 << 40 if fused else 0)
    _check("triton", 24 if band == 1 else 70, 36, torch.float32, loss,
           0.05 if loss == "clip" else 0.0, block=band)


@pytest.mark.parametrize("b,d,dtype,p_store", [(70, 36, torch.float32, False), (72, 40, torch.float16, True)])
@pytest.mark.parametrize("band", [16, 0])
@pytest.mark.parametrize("loss,eps", LOSSES)
def test_triton_tma_descriptor_kernels(monkeypatch, loss, eps, band, b, d, dtype, p_store):
    """The fused kernels loading by TMA tensor descriptors, as persistent programs (one or two
    here, each walking many tiles, the last ones partial), give the pointer kernels' numbers and
    the reference: statistics and gradient blocks, uneven bands (16 rows) and one band, P stored
    by descriptor when its rows are 16-byte aligned (B = 72) and by pointers when not (B = 70)."""
    monkeypatch.setattr(TUNING, "fused_max_logits", 1 << 40)
    made = []
    desc = triton_impl.TensorDescriptor
    monkeypatch.setattr(desc, "from_tensor", classmethod(
        lambda cls, t, block: (made.append(tuple(t.shape)), cls(t, list(t.shape), list(t.stride()), block))[1]))
    img, txt, scale, bias = _inputs(b, d, dtype, seed=b + d)
    run = lambda: _run(lambda i, t, s, bb: contrastive_loss(  # noqa: E731
        i, t, s, bb, loss=loss, impl="triton", triton_interpret=True, label_smoothing=eps,
        block_m=band, logits_budget_mb=0), img, txt, scale, bias, loss == "siglip")
    pointer = run()
    assert made == []
    monkeypatch.setattr(TUNING, "tma_force", True)
    tma = run()
    rows = band or b
    assert (b, d) in made and (rows, d) in made  # the statistics' A and the first band's A
    assert ((rows, b) in made) == p_store  # P by descriptor only when its rows are aligned
    # the same products, summed in another order by the tile loads' layouts: a 16-bit P may
    # round an element the other way
    tol = dict(rtol=1e-5, atol=1e-6) if dtype == torch.float32 else dict(rtol=2e-3, atol=1e-4)
    for key in pointer:
        torch.testing.assert_close(tma[key], pointer[key], **tol, msg=key)
    lowp = None if dtype == torch.float32 else _torch_lowp(img, txt, scale, bias, loss, eps)
    _assert_close(tma, _reference(img, txt, scale, bias, loss, eps), lowp, what="tma")


@pytest.mark.parametrize("loss,block", [("clip", (16, 20)), ("siglip", (16, 20)), ("clip", (64, 20)),
                                        ("clip", (16, 64)), ("siglip", (64, 20))])
def test_triton_kept_logits_and_memory_bands_agree(monkeypatch, loss, block):
    """The whole-matrix path (logits kept from forward to backward) and the recompute path
    with bands chosen by the memory rule (forced small here: 10 rows in the forward) and the
    backward's blocks of rows x columns (TUNING.grad_block, uneven last blocks; one row band, one
    column block or neither) give the same numbers."""
    img, txt, scale, bias = _inputs(53, 24, torch.float32, seed=11)
    run = lambda **kw: _run(lambda i, t, s, b: contrastive_loss(  # noqa: E731
        i, t, s, b, loss=loss, impl="triton", triton_interpret=True, **kw),
        img, txt, scale, bias, loss == "siglip")
    kept = run()
    monkeypatch.setattr(triton_impl, "band_rows", lambda m, n, d: 10)
    monkeypatch.setattr(TUNING, "grad_block", block)
    banded = run(logits_budget_mb=0)
    for key in kept:
        torch.testing.assert_close(banded[key], kept[key], rtol=1e-5, atol=1e-7)
    _assert_close(banded, _reference(img, txt, scale, bias, loss, 0.0), what="banded")


@pytest.mark.parametrize("fused", [True, False])
@pytest.mark.parametrize("diag", [0, -21, 9])
def test_triton_gradient_blocks_of_an_off_diagonal_block(monkeypatch, diag, fused):
    """The block primitives' triton backward over blocks of rows x columns (forced small) on a
    [45, 38] block whose positives sit at i - j == diag (a distributed step's block; 9: the
    positives leave through the bottom edge): the CLIP and SigLIP gradient blocks, their
    per-row sums and d-scale, as plain torch tiles give them."""
    from infclip.ops.blocks import clip_grads, siglip_grads

    monkeypatch.setattr(triton_impl, "band_rows", lambda m, n, d: 8)
    monkeypatch.setattr(TUNING, "grad_block", (16, 12))  # 3 x 4 blocks, uneven last ones
    monkeypatch.setattr(TUNING, "fused_max_logits", 1 << 40 if fused else 0)
    img, _, scale, bias = _inputs(45, 20, torch.float32, seed=3)
    txt = _inputs(38, 20, torch.float32, seed=4)[0]
    s = scale.reshape(())
    logits = s * img @ txt.T
    rows = torch.arange(45)
    ref = torch.where((rows - diag >= 0) & (rows - diag < 38),
                      (img * txt[(rows - diag).clamp(0, 37)]).sum(-1), 0.3)
    # LSEs a little above the block's own: P of the size a step's block has
    row_lse, col_lse = logits.logsumexp(1) + 0.5, logits.logsumexp(0) + 0.3
    label = dict(diag=diag, diag_value=1.9, offset=0.01)
    want = clip_grads(img, txt, s, row_lse, col_lse, ref, **label, impl="chunked_torch",
                      block_m=7, block_n=9)
    got = clip_grads(img, txt, s, row_lse, col_lse, ref, **label, impl="triton")
    want_clip_rows = want[0]
    for w, g, name in zip(want, got, ("clip rows", "clip columns")):
        torch.testing.assert_close(g, w, rtol=1e-5, atol=1e-6, msg=name)
    b = bias.reshape(())
    want = siglip_grads(img, txt, s, b, diag, impl="chunked_torch", block_m=7, block_n=9,
                        with_loss=True)
    got = siglip_grads(img, txt, s, b, diag, impl="triton", with_loss=True)
    for w, g, name in zip(want, got, ("pair losses", "rows", "columns", "sum G", "sum G S'")):
        torch.testing.assert_close(g, w, rtol=1e-5, atol=1e-6, msg=f"siglip {name}")
    # the rows handed to a sink that adds them into an fp32 sum (a sweep's step): as a plain
    # callable, and as the sweeps' own sink (assembly._adding_into), which names the sum as
    # sink.into (every block's GEMM then accumulates into the sum itself)
    from infclip.ops.assembly import _adding_into

    start = torch.randn(45, 20)
    for named in (False, True):
        for grads, want_rows in ((lambda sink: clip_grads(img, txt, s, row_lse, col_lse, ref, **label,
                                                          impl="triton", sink_a=sink), want_clip_rows),
                                 (lambda sink: siglip_grads(img, txt, s, b, diag, impl="triton", sink_a=sink),
                                  want[1])):
            total = start.clone()
            sink = _adding_into(total) if named else (lambda i0, i1, part, total=total: total[i0:i1].add_(part))
            assert hasattr(sink, "into") == named
            assert grads(sink)[0] is None
            torch.testing.assert_close(total, start + want_rows, rtol=1e-5, atol=1e-5,
                                       msg=f"sink, named {named}")


@pytest.mark.parametrize("b", [8192, 12288, 16384, 32768, 65536, 100000])
def test_gradient_blocks_keep_within_their_memory_budget(b):
    """The backward's recompute blocks (_grad_block, D = 768, bf16): a block and its fp32 row sum
    of grad_a (where the columns are split) take no more than _GRAD_FACTOR max(B D, 2^24) elements'
    bytes from _GRAD_FACTOR_MIN_N columns on (2 below), cover the rows and columns, and fall back
    to full-width bands within the same bytes when no block fits."""
    d, item = 768, 2
    rows, cols = triton_impl._grad_block(b, b, d, 0, item)
    factor = TUNING.grad_factor if b >= TUNING.grad_factor_min_n else 2.0
    budget = factor * max(b * d, 1 << 24) * item
    assert 0 < rows <= b and 0 < cols <= b
    assert rows * cols * item + (rows * d * 4 if cols < b else 0) <= budget
    assert triton_impl._grad_block(b, b, d, 512, item) == (512, b)  # a forced band height


@pytest.mark.parametrize("b,world", [(8192, 4), (16384, 2), (16384, 4), (32768, 4)])
def test_a_sweeps_gradient_blocks_take_the_global_batchs_budget(b, world):
    """A distributed sweep's column block of b columns (``width`` = the global batch) sizes its
    blocks as a gathered step over all B = world b columns would: within that budget, and no
    smaller than the column block's own (b = 16,384 of 65,536: 8,192 x 4,096 against 4,096 x 4,096)."""
    d, item, n_global = 768, 2, world * b
    own = triton_impl._grad_block(b, b, d, 0, item)
    rows, cols = triton_impl._grad_block(b, b, d, 0, item, width=n_global)
    factor = TUNING.grad_factor if b >= TUNING.grad_factor_min_n else 2.0
    assert rows * cols * item + (rows * d * 4 if cols < b else 0) <= factor * n_global * d * item
    assert rows * cols >= own[0] * own[1] and 0 < rows <= b and 0 < cols <= b
    if n_global == 65536:
        assert (own, (rows, cols)) == ((4096, 4096), (8192, 4096))
    assert triton_impl._grad_block(b, b, d, 0, item, width=b) == own
    if b < TUNING.grad_factor_min_n:  # (narrow column blocks keep their own)
        assert (rows, cols) == own


@pytest.mark.parametrize("b", [32768, 65536, 98304, 131072, 196608, 262144, 524288])
def test_wider_gradient_blocks_only_under_the_end_cast(b):
    """Where the backward casts grad_b's fp32 sum to the features' dtype at the end (``cast``), a
    TUNING.grad_blocks_wide block is taken first if it and its fp32 row sum take no more than that cast's
    B D elements of the dtype (the call's peak stays the cast's): 8,192 x 8,192 at 131k and 196k,
    16,384 x 8,192 at 262k and above; below ~104k, and without the cast, the blocks as before."""
    d, item = 768, 2
    before = triton_impl._grad_block(b, b, d, 0, item)
    rows, cols = triton_impl._grad_block(b, b, d, 0, item, cast=True)
    assert rows * (cols * item + d * 4) <= max(b * d * item, before[0] * (before[1] * item + d * 4))
    assert rows * cols >= before[0] * before[1]
    want = {131072: (8192, 8192), 196608: (8192, 8192), 262144: (16384, 8192), 524288: (16384, 8192)}
    assert (rows, cols) == want.get(b, before)


def test_gradient_blocks_fall_back_to_bands(monkeypatch):
    monkeypatch.setattr(TUNING, "grad_blocks", ((1 << 20, 1 << 20),))  # never fits
    rows, cols = triton_impl._grad_block(32768, 32768, 768, 0, 2)
    assert cols == 32768 and rows * 32768 * 2 <= TUNING.grad_factor * 32768 * 768 * 2


@pytest.mark.parametrize("m,n,diag", [(45, 38, 0), (45, 38, -21), (45, 38, 9), (64, 48, 3)])
def test_triton_interior_tiles_fast_path(monkeypatch, m, n, diag):
    """The CLIP statistics kernel's interior fast path (FAST: tiles inside the bounds and off the
    positives skip the masks) gives the masked kernel's sums bit for bit: 8 x 8 TMA tiles over
    [45, 38] (partial edge tiles) and [64, 48] (none), positives at i - j == diag crossing some
    tiles."""
    monkeypatch.setattr(TUNING, "fused_max_logits", 1 << 40)
    monkeypatch.setattr(TUNING, "tma_force", True)
    img, _, scale, _ = _inputs(m, 20, torch.float32, seed=5)
    txt = _inputs(n, 20, torch.float32, seed=6)[0]
    s = scale.reshape(())
    logits = s * img @ txt.T
    rows = torch.arange(m)
    ref = (img * txt[(rows - diag).clamp(0, n - 1)]).sum(-1)
    col_ref = (img[(torch.arange(n) + diag).clamp(0, m - 1)] * txt).sum(-1)
    row_shift, col_shift = logits.amax(1), logits.amax(0)

    def run(fast):
        monkeypatch.setattr(TUNING, "tma_stats", (8, 8, 16, 2, 4, 1, 2, fast))
        triton_impl._fused_config.cache_clear()
        return triton_impl.clip_stats_triton(img, txt, s, row_shift, col_shift, ref, col_ref, diag)[:4]

    want, got = run(0), run(1)
    for w, g, name in zip(want, got, ("row sums", "column sums", "row weighted", "column weighted")):
        assert torch.equal(g, w), name


@pytest.mark.parametrize("m,n,diag,chunk", [(45, 38, 0, 2), (45, 38, -21, 3), (45, 38, 9, 1),
                                            (64, 48, 3, 2), (64, 64, 0, 8)])
def test_triton_strip_sums_match_the_tile_kernel(monkeypatch, m, n, diag, chunk):
    """The column-strip kernel (plain sums only; the column terms summed in registers over a
    chunk of row blocks, reduced once an item) gives the per-tile kernel's row and column sums:
    8 x 8 tiles over [45, 38] (partial edge tiles, items whose chunk runs past the last row
    block) and [64, 48], positives at i - j == diag crossing some tiles, chunks of 1-8 row
    blocks, two programs walking the items; the weighted sums are left as they were."""
    monkeypatch.setattr(TUNING, "fused_max_logits", 1 << 40)
    monkeypatch.setattr(TUNING, "tma_force", True)
    monkeypatch.setattr(TUNING, "tma_strips", (8, 8, 16, 4, 1, 2, chunk))
    monkeypatch.setattr(TUNING, "strips_min_logits", 0)
    img, _, scale, _ = _inputs(m, 20, torch.float32, seed=7)
    txt = _inputs(n, 20, torch.float32, seed=8)[0]
    s = scale.reshape(())
    logits = s * img @ txt.T
    ref = (img * txt[(torch.arange(m) - diag).clamp(0, n - 1)]).sum(-1)
    col_ref = (img[(torch.arange(n) + diag).clamp(0, m - 1)] * txt).sum(-1)
    row_shift, col_shift = logits.amax(1), logits.amax(0)
    args = (img, txt, s, row_shift, col_shift, ref, col_ref, diag)
    want = triton_impl.clip_stats_triton(*args)[:4]
    out = torch.full((2 * m + 2 * n,), 0.25)
    got = triton_impl.clip_stats_triton(*args, weighted=False, out=out)[:4]
    for w, g, name in zip(want[:2], got[:2], ("row sums", "column sums")):
        torch.testing.assert_close(g - 0.25, w, rtol=1e-5, atol=1e-6, msg=name)
    assert torch.equal(got[2], torch.full((m,), 0.25)) and torch.equal(got[3], torch.full((n,), 0.25))
    dense = torch.exp(logits - row_shift[:, None]) * ((torch.arange(m)[:, None] - torch.arange(n)) != diag)
    torch.testing.assert_close(got[0] - 0.25, dense.sum(1), rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("m,n,diag", [(45, 38, 0), (45, 38, -21), (64, 48, 3), (64, 64, 0)])
def test_triton_gradient_epilogue_in_slices(monkeypatch, m, n, diag):
    """The fused gradient kernel's epilogue taken in 2 or 4 column slices of each tile (SPLIT)
    writes the one-slice kernel's gradients bit for bit and the same d scale: 8 x 16 TMA tiles
    over [45, 38] (partial edge tiles; P's rows unaligned, stored by pointers) and [64, 48] /
    [64, 64] (stored by the copy engine, blocks of 8 x 8 and 8 x 4), positives crossing slices.
    d scale is summed in the kernel: on the square block with its positives on the diagonal
    from the row refs, on the others (a sweep's column blocks) with the columns' refs too, added
    into a given accumulator."""
    monkeypatch.setattr(TUNING, "fused_max_logits", 1 << 40)
    monkeypatch.setattr(TUNING, "tma_force", True)
    monkeypatch.setattr(TUNING, "strips_min_logits", 0)
    img, _, scale, _ = _inputs(m, 20, torch.float32, seed=9)
    txt = _inputs(n, 20, torch.float32, seed=10)[0]
    s = scale.reshape(())
    logits = s * img @ txt.T
    ref = (img * txt[(torch.arange(m) - diag).clamp(0, n - 1)]).sum(-1)
    # the columns' refs (a column without its positive in the block: any value, as in a sweep)
    col_ref = (img[(torch.arange(n) + diag).clamp(0, m - 1)] * txt).sum(-1)
    own = m == n and diag == 0
    aux = torch.tensor([0.0, 0.75])

    def run(split, summed=False, into=None):
        monkeypatch.setattr(TUNING, "tma_grad", (8, 16, 16, 2, 4, 1, 2, split))
        return triton_impl.clip_grads_triton(
            img, txt, s, logits.logsumexp(1), logits.logsumexp(0), ref, diag=diag, diag_value=1.8,
            offset=0.01, coef=torch.tensor([0.5]), coef_scale=True, dscale_from=aux, dscale_index=1,
            dscale_summed=summed, col_ref=None if own else col_ref, dscale_out=into)

    want = run(1)
    assert want[2].item() == 0.375  # c aux[1], c = coef
    summed = run(1, True)
    assert torch.equal(summed[0], want[0]) and torch.equal(summed[1], want[1])
    for split in (2, 4):
        got = run(split, True)
        assert torch.equal(got[0], want[0]) and torch.equal(got[1], want[1]), split
        torch.testing.assert_close(got[2], summed[2], rtol=1e-6, atol=0, msg=str(split))
    sp = img @ txt.T  # (S'_ii is ref_i)
    shares = (torch.softmax(logits, 1) * (sp - ref[:, None]) + torch.softmax(logits, 0) * (sp - col_ref))
    torch.testing.assert_close(summed[2], 0.5 * shares.sum(), rtol=1e-4, atol=1e-6)
    into = torch.tensor(0.25)
    added = run(1, True, into)[2]
    assert added is into
    torch.testing.assert_close(added, 0.25 + summed[2], rtol=1e-6, atol=1e-7)


@pytest.mark.parametrize("b,eps", [(70, 0.0), (70, 0.1), (64, 0.0)])
def test_triton_backward_sums_d_scale_after_strip_statistics(monkeypatch, b, eps):
    """With the TMA kernels (forced here) and no logits kept, the CLIP forward takes the plain
    sums by column strips and the backward's gradient kernel sums d loss / d s itself (several
    blocks of rows x columns, uneven at B = 70): the loss and every gradient as the per-tile
    forward with its weighted sums gives them, and the reference."""
    monkeypatch.setattr(TUNING, "fused_max_logits", 1 << 40)
    monkeypatch.setattr(TUNING, "tma_force", True)
    monkeypatch.setattr(triton_impl, "band_rows", lambda m, n, d: 24)
    monkeypatch.setattr(TUNING, "grad_block", (32, 24))
    monkeypatch.setattr(TUNING, "strips_min_logits", b * b)
    strips, summed = [], []
    launch, grads = triton_impl._clip_sums_strips, triton_impl.clip_grads_triton
    monkeypatch.setattr(triton_impl, "_clip_sums_strips", lambda *a: (strips.append(1), launch(*a))[1])
    monkeypatch.setattr(triton_impl, "clip_grads_triton", lambda *a, **k: (
        summed.append(k.get("dscale_summed")), grads(*a, **k))[1])
    img, txt, scale, bias = _inputs(b, 24, torch.float32, seed=b)
    run = lambda: _run(lambda i, t, s_, bb: contrastive_loss(  # noqa: E731
        i, t, s_, impl="triton", triton_interpret=True, label_smoothing=eps, logits_budget_mb=0),
        img, txt, scale, bias, False)
    ours = run()
    assert strips == [1] and summed == [True]
    monkeypatch.setattr(TUNING, "strips", False)
    tiles = run()
    assert strips == [1] and summed == [True, False]
    for key in ours:
        torch.testing.assert_close(ours[key], tiles[key], rtol=1e-5, atol=1e-7, msg=key)
    _assert_close(ours, _reference(img, txt, scale, bias, "clip", eps), what="strips")


def test_strips_only_from_their_size_and_without_kept_logits(monkeypatch):
    monkeypatch.setattr(TUNING, "tma_force", True)
    img, txt, _, _ = _inputs(64, 8, torch.float32)
    monkeypatch.setattr(TUNING, "strips_min_logits", 64 * 64)
    assert triton_impl.sums_in_strips(img, txt, "")
    assert not triton_impl.sums_in_strips(img, txt, "whole")
    assert not triton_impl.sums_in_strips(img[:63], txt, "")
    unaligned = img[:, :6].contiguous(), txt[:, :6].contiguous()  # 24-byte rows
    assert not triton_impl.sums_in_strips(*unaligned, "")


def test_dscale_summed_refuses_what_it_cannot_sum(monkeypatch):
    img, txt, scale, _ = _inputs(16, 8, torch.float32)
    lse = torch.zeros(16)
    with pytest.raises(ValueError, match="dscale_summed"):  # no fused TMA kernels
        triton_impl.clip_grads_triton(img, txt, scale, lse, lse, lse, dscale_summed=True)
    monkeypatch.setattr(TUNING, "tma_force", True)
    monkeypatch.setattr(TUNING, "strips_min_logits", 0)
    with pytest.raises(ValueError, match="col_ref"):  # positives off the diagonal, no col_ref
        triton_impl.clip_grads_triton(img, txt, scale, lse, lse, lse, diag=3, dscale_summed=True)
    with pytest.raises(ValueError, match="col_ref"):  # not square, no col_ref
        triton_impl.clip_grads_triton(img, txt[:12], scale, lse, lse[:12], lse, dscale_summed=True)


@pytest.mark.parametrize("factor", [1, 2])
@pytest.mark.parametrize("loss,eps", [("clip", 0.0), ("clip", 0.1)])
def test_triton_logits_kept_as_bands_give_the_recompute_numbers(monkeypatch, loss, eps, factor):
    """With 16-bit features and a budget for the B x B matrix in their dtype but not in fp32,
    the forward's GEMM bands are kept and the backward reads them band by band (uneven last band;
    ``factor`` forward bands at a time: 16 or 32 rows) instead of redoing the GEMMs: the same
    numbers as the recompute path, which runs the same GEMMs into the same dtype, and the
    reference; no logit GEMM in the backward."""
    monkeypatch.setattr(TUNING, "bands_min_logits", 0)  # bands kept at this small B
    # fp16 bands (bf16 ones in use: the interpreter's bf16 dots are wrong, and the mechanism is
    # the same for both dtypes)
    monkeypatch.setattr(TUNING, "bands_dtypes", (torch.bfloat16, torch.float16))
    monkeypatch.setattr(triton_impl, "band_rows", lambda m, n, d: 16)
    monkeypatch.setattr(TUNING, "kept_bands_factor", factor)
    monkeypatch.setattr(TUNING, "grad_block", (16, 64))  # the backward in the same bands
    monkeypatch.setattr(TUNING, "fused_max_logits", 0)  # the recompute: cuBLAS bands
    img, txt, scale, bias = _inputs(53, 24, torch.float16, seed=5)
    whole = 53 * 53 * 6 / 2**20  # MiB for S' fp32 + dS fp16
    budget = 53 * 53 * 2 / 2**20 * 1.01  # the fp16 matrix fits, the fp32 one does not
    assert budget < whole
    calls = []
    logits = triton_impl._logits
    monkeypatch.setattr(triton_impl, "_logits", lambda a, b, out: (calls.append(a.shape[0]), logits(a, b, out))[1])
    run = lambda **kw: _run(lambda i, t, s, b: contrastive_loss(  # noqa: E731
        i, t, s, b, loss=loss, impl="triton", triton_interpret=True, label_smoothing=eps, **kw),
        img, txt, scale, bias, loss == "siglip")
    kept = run(logits_budget_mb=budget)
    assert calls == [16, 16, 16, 5]  # the forward's bands only
    calls.clear()
    recomputed = run(logits_budget_mb=0)
    assert calls == [16, 16, 16, 5] * 2  # forward and backward
    for key in kept:
        torch.testing.assert_close(kept[key], recomputed[key], rtol=1e-6, atol=1e-7, msg=key)
    _assert_close(kept, _reference(img, txt, scale, bias, loss, eps),
                  _torch_lowp(img, txt, scale, bias, loss, eps), what="kept bands")


@pytest.mark.parametrize("fused", [True, False])
def test_triton_siglip_takes_its_gradients_in_the_forward(monkeypatch, fused):
    """SigLIP's pair gradient needs no row statistic, so a forward whose backward will follow
    runs the gradient pass itself (pair losses summed in the same pass): the logit GEMM bands
    (or the fused kernels) run in the forward only, never in the backward, whatever the logit
    budget; the numbers match the reference, and the loss the statistics pass gives without a
    backward; the backward scales by the incoming gradient (UPSTREAM)."""
    monkeypatch.setattr(triton_impl, "band_rows", lambda m, n, d: 16)
    monkeypatch.setattr(TUNING, "grad_block", (16, 64))  # full-width bands of 16 rows
    if not fused:
        monkeypatch.setattr(TUNING, "fused_max_logits", 0)  # cuBLAS bands + the pass
    img, txt, scale, bias = _inputs(53, 24, torch.float32, seed=6)
    gemms, launches = [], []
    logits, fused_launch = triton_impl._logits, triton_impl._fused
    monkeypatch.setattr(triton_impl, "_logits", lambda a, b, out: (gemms.append(a.shape[0]), logits(a, b, out))[1])
    monkeypatch.setattr(triton_impl, "_fused", lambda kernel, *a, **k: (launches.append(kernel.fn.__name__), fused_launch(kernel, *a, **k))[1])
    kw = dict(loss="siglip", impl="triton", triton_interpret=True)
    for budget in (0.0, 64.0):
        gemms.clear(), launches.clear()
        leaves = [x.detach().clone().requires_grad_() for x in (img, txt, scale, bias)]
        loss = contrastive_loss(*leaves, **kw, logits_budget_mb=budget)
        forward = (list(gemms), list(launches))
        (loss * UPSTREAM).backward()
        assert (gemms, launches) == forward  # the backward launched no logit GEMM or kernel
        assert forward == (([], ["_siglip_grad_fused_kernel"] * 4) if fused else ([16, 16, 16, 5], []))
        with torch.no_grad():
            alone = contrastive_loss(*leaves, **kw)
        torch.testing.assert_close(loss.detach(), alone, rtol=1e-6, atol=0)
        ours = {"loss": loss.detach().double(), "d_img": leaves[0].grad.double(),
                "d_txt": leaves[1].grad.double(), "d_scale": leaves[2].grad.double(),
                "d_bias": leaves[3].grad.double()}
        _assert_close(ours, _reference(img, txt, scale, bias, "siglip", 0.0), what=f"budget {budget}")


def test_kept_logits_only_when_they_fit():
    from infclip.ops.assembly import keep_logits as _keep_logits

    assert _keep_logits("triton", 3344, torch.bfloat16, 0, 64.0) == "whole"  # S' fp32 + dS bf16: 64 MiB
    assert not _keep_logits("triton", 3345, torch.bfloat16, 0, 64.0)  # bands only above B = 16,384
    assert _keep_logits("triton", 16385, torch.bfloat16, 0, 1024.0) == "bands"  # 512 MiB, not 1.5 GiB
    assert not _keep_logits("triton", 16385, torch.float16, 0, 1024.0)  # fp16 logits overflow
    assert not _keep_logits("triton", 16384, torch.bfloat16, 0, 1024.0)  # not above 16,384
    assert _keep_logits("triton", 32768, torch.bfloat16, 0, 8192.0) == "whole"  # fp32 fits: 6 GiB
    assert _keep_logits("triton", 65536, torch.bfloat16, 0, 8192.0) == "bands"
    assert not _keep_logits("triton", 65537, torch.bfloat16, 0, 8192.0)
    assert not _keep_logits("triton", 2897, torch.float32, 0, 64.0)  # fp32 features: whole only
    assert _keep_logits("triton", 20000, torch.float32, 0, 8192.0) == "whole"
    assert not _keep_logits("triton", 10, torch.float32, 0, 0.0)
    assert not _keep_logits("triton", 10, torch.float32, 16, 64.0)  # a band height was asked for
    assert not _keep_logits("chunked_torch", 10, torch.float32, 0, 64.0)


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


def _variant(monkeypatch, impl: str) -> dict:
    """The op's keywords for ``impl``; "triton_strips": the triton impl with the TMA kernels
    forced (as on Hopper) and no logits kept, so that the CLIP forward takes the column-strip
    sums and its backward sums d scale."""
    if impl != "triton_strips":
        return dict(impl=impl, triton_interpret=True)
    monkeypatch.setattr(TUNING, "tma_force", True)
    monkeypatch.setattr(TUNING, "fused_max_logits", 1 << 40)
    monkeypatch.setattr(TUNING, "strips_min_logits", 0)
    grads = triton_impl.clip_grads_triton

    def summed_in_backward(*args, **kw):  # the strips' forward leaves d scale to the backward
        assert kw["dscale_summed"]
        return grads(*args, **kw)

    monkeypatch.setattr(triton_impl, "clip_grads_triton", summed_in_backward)
    return dict(impl="triton", triton_interpret=True, logits_budget_mb=0)


@pytest.mark.parametrize("impl", ["chunked_torch", "triton", "triton_strips"])
def test_overflowing_logits_stay_exact(monkeypatch, impl):
    """An off-diagonal logit 100 above its diagonal (s = 100, cosines 1 and 0) would overflow
    exp at a shift on the diagonal; the Cauchy-Schwarz bound keeps every exponent <= 64, with
    no recompute and no host sync."""
    kw = _variant(monkeypatch, impl)
    img, txt, scale, bias = _inputs(20, 8, torch.float32, seed=5, scale=100.0)
    txt[7] = img[3]  # cos(I_3, T_7) = 1
    txt[3] = F.normalize(txt[3] - (txt[3] @ img[3]) * img[3], dim=0)  # cos(I_3, T_3) = 0
    ours = _run(lambda i, t, s, b: contrastive_loss(i, t, s, **kw),
                img, txt, scale, bias, False)
    ref = _reference(img, txt, scale, bias, "clip", 0.0)
    assert ref["loss"].item() > 100 / 40  # row 3 alone contributes ~100 / (2 B)
    for key in ref:
        torch.testing.assert_close(ours[key], ref[key], rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("impl", ["chunked_torch", "triton", "triton_strips"])
def test_scale_gradient_finite_when_only_the_weighted_sum_overflows(monkeypatch, impl):
    """An off-diagonal logit ~88.5 above its diagonal: exp of it still fits in fp32, but
    exp(.) * S' (S' = 1.5, unnormalised features) does not. The d-scale sums must not
    overflow (they are weighted by S' - S'_ii, under a shift that bounds every exponent)."""
    kw = _variant(monkeypatch, impl)
    b, d = 6, 8  # one pair per axis (two axes unused: 32-byte rows, as TMA loads need)
    img = torch.zeros(b, d, dtype=torch.float64)
    txt = torch.zeros(b, d, dtype=torch.float64)
    for i in range(b):  # pair i: image and text on axis i
        img[i, i] = 1.0
        txt[i, i] = 1.0
    img[2, :4] = torch.tensor([0.0, 0.0, 0.05, 1.5], dtype=torch.float64)  # <I2, T3> = 1.5
    txt[2, :4] = torch.tensor([0.0, 0.0, 1.0, 0.0], dtype=torch.float64)   # <I2, T2> = 0.05
    scale = torch.tensor([61.0])  # S_23 - S_22 = 61 * 1.45 = 88.45
    ours = _run(lambda i, t, s, bb: contrastive_loss(i, t, s, **kw),
                img.float(), txt.float(), scale, torch.zeros(1), False)
    ref = _reference(img.float(), txt.float(), scale, torch.zeros(1), "clip", 0.0)
    assert math.isfinite(ours["d_scale"].item())
    for key in ref:
        torch.testing.assert_close(ours[key], ref[key], rtol=1e-4, atol=1e-5)


def _confident_pairs(b, d, seed, noise):
    """Features whose positives are far above every negative (a model late in training)."""
    g = torch.Generator().manual_seed(seed)
    img = F.normalize(torch.randn(b, d, generator=g, dtype=torch.float64), dim=-1)
    txt = F.normalize(img + noise * torch.randn(b, d, generator=g, dtype=torch.float64), dim=-1)
    return img.float(), txt.float()


@pytest.mark.parametrize("impl", ["chunked_torch", "triton", "triton_strips"])
def test_small_clip_loss_keeps_relative_precision(monkeypatch, impl):
    """Loss ~1e-3 at s = 100: assembled as LSE - diagonal it loses ~3 digits to cancellation
    (terms of size ~s); log1p of the off-diagonal sum keeps fp32's relative precision. Same
    for the d-scale term (E[S'] - S'_ii, weights taken relative to S'_ii)."""
    kw = _variant(monkeypatch, impl)
    img, txt = _confident_pairs(300, 32, seed=2, noise=0.16)
    scale = torch.tensor([100.0])
    ours = _run(lambda i, t, s, b: contrastive_loss(i, t, s, **kw),
                img, txt, scale, torch.zeros(1), False)
    ref = _reference(img, txt, scale, torch.zeros(1), "clip", 0.0)
    assert 1e-5 < ref["loss"].item() < 1e-1
    for key in ("loss", "d_scale"):
        rel = ((ours[key] - ref[key]).abs() / ref[key].abs()).item()
        assert rel < 2e-5, f"{key}: relative error {rel:.2e}"


@pytest.mark.parametrize("impl", ["chunked_torch", "triton"])
def test_small_siglip_loss_keeps_relative_precision(impl):
    """Every pair confidently right: each softplus term is ~exp(t) << 6e-8, where
    log(1 + exp(t)) rounds to 0 in fp32 and log1p(exp(t)) does not."""
    img, txt = _confident_pairs(40, 64, seed=3, noise=0.01)
    scale, bias = torch.tensor([100.0]), torch.tensor([-60.0])
    ours = _run(lambda i, t, s, bb: contrastive_loss(i, t, s, bb, loss="siglip", impl=impl,
                                                    triton_interpret=True),
                img, txt, scale, bias, True)
    ref = _reference(img, txt, scale, bias, "siglip", 0.0)
    assert ref["loss"].item() < 1e-4
    rel = ((ours["loss"] - ref["loss"]).abs() / ref["loss"]).item()
    assert rel < 1e-4, f"relative error {rel:.2e}"


def test_pair_log1p_keeps_relative_precision_over_the_unit_interval():
    """The per-pair log1p (a polynomial, no special function) against fp64 from 1e-30 to 1:
    within 5e-7 relative everywhere (fp32's own rounding is 6e-8), exactly 0 at 0, NaN kept."""
    import triton
    import triton.language as tl

    @triton.jit
    def kernel(u_ptr, out_ptr, n, BLOCK: tl.constexpr):
        offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
        u = tl.load(u_ptr + offs, mask=offs < n, other=0.0)
        tl.store(out_ptr + offs, kernels_common._log1p_unit(u), mask=offs < n)

    u = torch.cat([torch.logspace(-30, 0, 3001), torch.linspace(0, 1, 4097), torch.tensor([float("nan")])])
    u = u.float()
    out = torch.empty_like(u)
    kernel[(triton.cdiv(u.numel(), 1024),)](u, out, u.numel(), BLOCK=1024)
    ref = torch.log1p(u.double())
    pos = u > 0
    rel = ((out.double() - ref).abs() / ref)[pos]
    assert rel.max().item() < 5e-7, f"relative error {rel.max().item():.2e}"
    assert out[u == 0].eq(0).all() and out[-1].isnan()


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


@pytest.mark.parametrize("which", ["image_features", "text_features", "logit_scale", "logit_bias"])
@pytest.mark.parametrize("impl", ["chunked_torch", "triton"])
def test_non_finite_input(which, impl):
    """Default: folded into the result on the device (a NaN loss, no host sync); "raise":
    an error naming the input. The SigLIP bias is checked like the rest."""
    img, txt, scale, bias = _inputs(6, 4, torch.float32)
    args = {"image_features": img, "text_features": txt, "logit_scale": scale, "logit_bias": bias}
    args[which] = args[which].clone()
    args[which].view(-1)[0] = float("nan")
    loss = "siglip" if which == "logit_bias" else "clip"
    if loss == "clip":
        args["logit_bias"] = None  # (the CLIP loss takes none)
    call = lambda check: contrastive_loss(*args.values(), loss=loss, impl=impl,  # noqa: E731
                                          triton_interpret=True, check_finite=check)
    assert torch.isnan(call(True))
    with pytest.raises(FloatingPointError, match=which):
        call("raise")
    if which != "logit_bias":  # an infinite feature or scale too
        args[which].view(-1)[0] = float("inf")
        assert not torch.isfinite(call(True))


def test_siglip_needs_bias_and_unknown_names_fail():
    img, txt, scale, _ = _inputs(6, 4, torch.float32)
    with pytest.raises(ValueError, match="logit_bias"):
        contrastive_loss(img, txt, scale, loss="siglip")
    with pytest.raises(ConfigError, match="unknown contrastive_loss impl 'cuda_magic'"):
        contrastive_loss(img, txt, scale, impl="cuda_magic")
    with pytest.raises(ValueError, match="unknown loss"):
        contrastive_loss(img, txt, scale, loss="triplet")


@pytest.mark.parametrize("kw,match", [
    (dict(block_m=-4), "block_m must be >= 0"),
    (dict(block_n=-1), "block_n must be >= 0"),
    (dict(label_smoothing=1.0), r"label_smoothing must be in \[0, 1\)"),
    (dict(label_smoothing=-0.1), r"label_smoothing must be in \[0, 1\)"),
    (dict(label_smoothing=float("nan")), r"label_smoothing must be in \[0, 1\)"),
    (dict(distributed="rign"), "unknown distributed scheme 'rign'"),
    (dict(grad_reduction="avg"), "grad_reduction must be 'mean' or 'sum'"),
    (dict(logits_budget_mb=-1.0), "logits_budget_mb must be >= 0"),
    (dict(graph_max_batch=-1), "graph_max_batch must be an integer >= 0"),
    (dict(graph_max_batch=4096.0), "graph_max_batch must be an integer >= 0"),
    (dict(check_finite="yes"), "check_finite must be"),
])
def test_bad_options_fail_without_a_process_group(kw, match):
    """Checked on every call, not only where a process group makes them matter."""
    img, txt, scale, _ = _inputs(6, 4, torch.float32)
    with pytest.raises(ValueError, match=match):
        contrastive_loss(img, txt, scale, **kw)


def test_functional_triton_on_cpu_says_what_ran():
    """Without triton_interpret, impl="triton" on CPU runs chunked_torch and warns so (as the
    module does); with it, the interpreter runs the kernels."""
    img, txt, scale, _ = _inputs(12, 8, torch.float32)
    with pytest.warns(UserWarning, match="not on CUDA: ran chunked_torch"):
        loss = contrastive_loss(img, txt, scale, impl="triton")
    torch.testing.assert_close(loss, contrastive_loss_reference(img, txt, scale), rtol=1e-5, atol=1e-6)


def test_config_section_errors_name_key_and_file():
    with pytest.raises(ConfigError, match=r"run\.json.*unknown key 'impll'.*did you mean 'impl'"):
        ContrastiveLossConfig.from_dict({"impll": "triton"}, source="run.json")
    with pytest.raises(ConfigError, match="'impl' must be one of"):
        ContrastiveLossConfig.from_dict({"impl": "fast"})
    with pytest.raises(ConfigError, match="'graph_max_batch' must be >= 0, got -1"):
        ContrastiveLossConfig.from_dict({"graph_max_batch": -1})
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
    # triton with the logits kept (an extra [B, B] output, read by the backward op)
    kept = (img, txt, scale, None, "clip", "triton", 0.1, 0, 0, False, 1.0)
    assert torch.ops.infclip.contrastive_loss(*kept)[4].shape == (10, 10)
    torch.library.opcheck(torch.ops.infclip.contrastive_loss.default, kept,
                          test_utils=("test_schema", "test_faketensor", "test_aot_dispatch_dynamic"))

    def step(i, t, s):
        return torch.ops.infclip.contrastive_loss(i, t, s, None, "clip", "chunked_torch", 0.0, 4, 4, False)[0]

    compiled = torch.compile(step, fullgraph=True, backend="aot_eager")
    out = compiled(img, txt, scale)
    out.backward()
    torch.testing.assert_close(out, contrastive_loss_reference(img, txt, scale), rtol=1e-5, atol=1e-6)
    assert img.grad is not None and scale.grad is not None


def test_scheme_args_follow_the_op_schema():
    """What the public API passes after the op's fixed arguments: on one device nothing (the
    default graph_max_batch, which is the schema's), or the schema's own defaults of the scheme's
    four followed by another graph_max_batch (0 included); the scheme's values otherwise, in the
    schema's order."""
    from infclip.ops.config import DEFAULT_GRAPH_MAX_BATCH, ContrastiveLossConfig
    from infclip.ops.registered import scheme_args
    from infclip.ops.sweeps import Scheme

    schema = torch.ops.infclip.contrastive_loss.default._schema
    tail = schema.arguments[-5:]
    assert [a.name for a in tail] == ["scheme", "group_name", "local_world_size", "grad_reduction",
                                      "graph_max_batch"]
    assert tail[-1].default_value == DEFAULT_GRAPH_MAX_BATCH == ContrastiveLossConfig().graph_max_batch > 0
    assert scheme_args(Scheme("none")) == ()
    assert scheme_args(Scheme("none"), "sum", DEFAULT_GRAPH_MAX_BATCH) == ()
    assert scheme_args(Scheme("none"), "sum", 0) == tuple(a.default_value for a in tail[:4]) + (0,)
    assert scheme_args(Scheme("none"), graph_max_batch=8) == tuple(a.default_value for a in tail[:4]) + (8,)
    assert scheme_args(Scheme("ring", "g0", 2), "sum", 8) == ("ring", "g0", 2, "sum")


@pytest.mark.parametrize("loss,impl", [("clip", "auto"), ("siglip", "auto"), ("clip", "triton"),
                                       ("siglip", "triton")])
def test_functional_api_compiles_fullgraph_with_default_args(loss, impl):
    """The default check_finite no longer reads a device value on the host, so the functional
    API compiles as one graph (the same property lets it be captured in a CUDA graph)."""
    img, txt, scale, bias = _inputs(9, 8, torch.float32)
    kw = dict(impl=impl, triton_interpret=True) if impl == "triton" else {}

    def fn(i, t, s, b):
        return contrastive_loss(i, t, s, b if loss == "siglip" else None, loss=loss, **kw)

    ours = _run(torch.compile(fn, fullgraph=True, backend="aot_eager"), img, txt, scale, bias,
                loss == "siglip")
    _assert_close(ours, _reference(img, txt, scale, bias, loss, 0.0), what="compiled")


@pytest.mark.parametrize("loss", ["clip", "siglip"])
@pytest.mark.parametrize("entry", ["local", "local_triton", "distributed_op"])
def test_backward_fills_no_gradients_for_the_saved_outputs(loss, entry):
    """Only the loss output has a gradient: autograd must not allocate and zero-fill one for each
    output the op saves for its backward (the statistics, the kept [B, B] logits, the gathered
    features: a memset of each per call). Counted at the dispatcher during ``backward()``."""
    from torch.utils._python_dispatch import TorchDispatchMode

    from infclip.ops.contrastive_loss import distributed_contrastive_loss

    class Zeros(TorchDispatchMode):
        def __init__(self):
            super().__init__()
            self.made = []

        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            if func.overloadpacket in (torch.ops.aten.zeros, torch.ops.aten.zeros_like, torch.ops.aten.zero_):
                self.made.append(str(func))
            return func(*args, **(kwargs or {}))

    torch.manual_seed(0)
    img = F.normalize(torch.randn(15, 12), dim=-1).requires_grad_()
    txt = F.normalize(torch.randn(15, 12), dim=-1).requires_grad_()
    scale = torch.tensor([7.3], requires_grad=True)
    bias = torch.tensor([-3.0], requires_grad=True) if loss == "siglip" else None
    if entry == "distributed_op":
        out = distributed_contrastive_loss(img, txt, scale, bias, scheme="none", loss=loss,
                                           impl="chunked_torch")
    else:
        impl = "triton" if entry == "local_triton" else "chunked_torch"
        out = contrastive_loss(img, txt, scale, bias, loss=loss, impl=impl, triton_interpret=True)
    with Zeros() as mode:
        out.backward()
    assert mode.made == []
    assert img.grad is not None and scale.grad is not None


def _op_leaves(loss, bias_grad, seed=7):
    img, txt, scale, bias = _inputs(23, 10, torch.float32, seed=seed)
    leaves = [img.requires_grad_(), txt.requires_grad_(), scale.requires_grad_()]
    b = bias.requires_grad_(bias_grad) if loss == "siglip" else None
    return leaves, b


@pytest.mark.parametrize("impl", ["chunked_torch", "triton"])
@pytest.mark.parametrize("loss,bias_grad", [("clip", False), ("siglip", True), ("siglip", False)])
def test_op_autograd_gives_the_reference_gradients(loss, bias_grad, impl):
    """The op's hand-written autograd (its Autograd kernel and autograd.Function):
    autograd.grad with create_graph=False gives the reference's gradient for every input that
    asks for one, in its shape; a SigLIP bias that does not require grad gets none."""
    leaves, b = _op_leaves(loss, bias_grad)
    wrt = leaves + ([b] if bias_grad else [])
    out = contrastive_loss(*leaves, b, loss=loss, impl=impl, triton_interpret=True)
    assert out.shape == () and out.requires_grad
    grads = torch.autograd.grad(out * UPSTREAM, wrt, create_graph=False)
    ref_in = [x.detach().double().requires_grad_() for x in wrt]
    ref_b = ref_in[3] if bias_grad else (b.detach().double() if b is not None else None)
    ref = contrastive_loss_reference(*ref_in[:3], ref_b, loss=loss)
    ref_grads = torch.autograd.grad(ref * UPSTREAM, ref_in)
    torch.testing.assert_close(out.double(), ref.detach(), rtol=1e-5, atol=1e-6)
    for g, r, x in zip(grads, ref_grads, wrt):
        assert g.shape == x.shape and g.dtype == x.dtype
        torch.testing.assert_close(g.double(), r, rtol=1e-4, atol=1e-6)
    if loss == "siglip" and not bias_grad:
        out = contrastive_loss(*leaves, b, loss=loss, impl=impl, triton_interpret=True)
        out.backward()
        assert b.grad is None and leaves[2].grad is not None


@pytest.mark.parametrize("loss", ["clip", "siglip"])
def test_op_without_grad_builds_no_graph(loss):
    """Under torch.no_grad(), or with no input requiring grad, the op runs below autograd: the
    same value, no grad_fn, no logit matrix kept for a backward that will not come; the
    registered op's saved outputs never require grad."""
    leaves, b = _op_leaves(loss, True)
    kw = dict(loss=loss, impl="triton", triton_interpret=True)
    with_grad = contrastive_loss(*leaves, b, **kw)
    with torch.no_grad():
        quiet = contrastive_loss(*leaves, b, **kw)
    plain = contrastive_loss(*(x.detach() for x in leaves), b.detach() if b is not None else None, **kw)
    for out in (quiet, plain):  # (SigLIP's loss with a backward comes from its gradient pass)
        assert out.grad_fn is None and not out.requires_grad
        torch.testing.assert_close(out, with_grad.detach(), rtol=0 if loss == "clip" else 1e-6, atol=0)
    outs = torch.ops.infclip.contrastive_loss(*leaves, b, loss, "triton", 0.0, 0, 0, False, 64.0)
    assert outs[0].requires_grad and not any(t.requires_grad for t in outs[1:])
    budgets = []
    op = importlib.import_module("infclip.ops.assembly")
    real = op.keep_logits
    try:
        op.keep_logits = lambda *args: (budgets.append(args[-1]), real(*args))[1]
        with torch.no_grad():
            contrastive_loss(*leaves, b, **kw, logits_budget_mb=512.0)
        contrastive_loss(*(x.detach() for x in leaves), b.detach() if b is not None else None, **kw,
                         logits_budget_mb=512.0)
        contrastive_loss(*leaves, b, **kw, logits_budget_mb=512.0)
    finally:
        op.keep_logits = real
    # a logit matrix is kept only for a backward that will come; SigLIP then takes its gradients
    # in the forward and keeps none
    assert budgets == [0.0, 0.0, 512.0 if loss == "clip" else 0.0]


def test_op_create_graph_gives_the_same_first_order_gradients():
    """create_graph=True gives the same first-order gradients; the backward op itself has no
    derivative, so a second derivative through the op is an error naming it (not a None or a
    number that leaves the op out)."""
    import warnings

    leaves, _ = _op_leaves("clip", False)
    out = contrastive_loss(*leaves, impl="triton", triton_interpret=True)
    first = torch.autograd.grad(out, leaves, retain_graph=True)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        graphed = torch.autograd.grad(out, leaves, create_graph=True)
        for g, h in zip(first, graphed):
            torch.testing.assert_close(g, h.detach(), rtol=0, atol=0)
        with pytest.raises(RuntimeError, match="no second-order gradient"):
            torch.autograd.grad(graphed[2].sum(), leaves[2], allow_unused=True)


def test_tuning_sets_fields_for_a_block_and_documents_each():
    """ops/tuning.py: ``tuning(...)`` sets fields of the process-wide TUNING for a block and
    restores them (also after an error); an unknown field is an error, not a new attribute; every
    field carries a docstring (what it controls, its unit)."""
    import ast
    import dataclasses
    import inspect

    from infclip.ops import tuning as tuning_module
    from infclip.ops.tuning import Tuning, tuning

    before = TUNING.strips, TUNING.grad_block
    with pytest.raises(RuntimeError):
        with tuning(strips=not before[0], grad_block=(8, 8)) as t:
            assert t is TUNING and TUNING.strips is (not before[0]) and TUNING.grad_block == (8, 8)
            raise RuntimeError
    assert (TUNING.strips, TUNING.grad_block) == before
    with pytest.raises(TypeError, match="strip"):
        with tuning(strip=False):
            pass
    with pytest.raises(AttributeError):
        TUNING.no_such_knob = 1
    body = ast.parse(inspect.getsource(tuning_module)).body
    cls = next(n for n in body if isinstance(n, ast.ClassDef) and n.name == "Tuning")
    documented = {a.target.id for a, doc in zip(cls.body, cls.body[1:]) if isinstance(a, ast.AnnAssign)
                  and isinstance(doc, ast.Expr) and isinstance(doc.value, ast.Constant)}
    assert {f.name for f in dataclasses.fields(Tuning)} == documented
