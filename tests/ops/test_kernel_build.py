"""The op's new Triton kernel variants compile for a Hopper GPU, checked on a machine without one.

The CPU tests run the kernels under the Triton interpreter, which checks their numbers but not
that the GPU compiler accepts them (a flattened persistent loop once failed there only). Triton
compiles to a cubin with its own ptxas for any CUDA target, so bench/bench_kernel_resources.py
(without TRITON_INTERPRET) builds the SigLIP gradient kernel with the pair losses in its epilogue
(the forward of a call whose backward follows) for sm_90, with TMA descriptor loads and stores,
TMA loads with pointer stores, and pointer loads, the CLIP gradient kernel with the op's tiles
(its epilogue in column slices), and the warp-specialised Gluon kernels (ops/gluon_kernels.py,
which no interpreter runs: the CLIP and SigLIP gradient blocks, the CLIP forward's sums), and
reads back what each uses.
"""

import json
import os
import subprocess
import sys
import time

import pytest
import triton

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
PTXAS = os.path.join(os.path.dirname(triton.__file__), "backends", "nvidia", "bin", "ptxas")

# the --match values each test reads, with their rough compile time on 2 cores (seconds), by which
# the module's fixture shares them out
COST = {"loss=True": 10, "gluon_plain_clip_grad": 6, "gluon_clip_sums": 6, "gluon_clip_grad": 5,
        "gluon_siglip": 4, "gluon_plain_siglip": 4, "clip_grad tma": 3, "clip_shift": 2}
MATCHES = {"test_siglip_gradient_with_loss_compiles_for_sm90": ["loss=True"],
           "test_clip_shift_launch_with_true_maxima_compiles_for_sm90": ["clip_shift"],
           "test_clip_gradient_slices_compile_for_sm90": ["clip_grad tma"],
           "test_gluon_siglip_gradient_compiles_for_sm90": ["gluon_siglip", "gluon_plain_siglip"],
           "test_gluon_clip_sums_compiles_for_sm90": ["gluon_clip_sums"]}


def _matches_of(item) -> list:
    if item.originalname == "test_gluon_clip_gradient_compiles_for_sm90":
        return [item.callspec.params["label"]]
    return MATCHES.get(item.originalname, [])


@pytest.fixture(scope="module")
def built(request, tmp_path_factory):
    """bench_kernel_resources.py's output for every match the selected tests of this module read:
    a function of the match giving {"stdout", "error"}. The matches run in two processes at once
    (tests/ops/_kernel_resources.py: each runs the bench's main once per match, its own empty
    Triton cache), so torch and Triton start twice, not once per match, and both cores compile.
    A match whose process died or ran out of time before it finished gets that process's exit
    and output as its error, so only the tests reading it fail."""
    wanted = sorted({m for item in request.session.items if getattr(item, "module", None) is request.module
                     for m in _matches_of(item)}, key=lambda m: (-COST[m], m))
    shares, load = [[], []], [0, 0]
    for match in wanted:  # the longest first, each to the less loaded process
        i = load.index(min(load))
        shares[i].append(match)
        load[i] += COST[match]
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    procs = []
    try:
        for i, share in enumerate(s for s in shares if s):
            tmp = tmp_path_factory.mktemp(f"kernels{i}")
            with open(tmp / "output.txt", "w") as log:  # not a pipe: nothing waits on reading it
                proc = subprocess.Popen(
                    [sys.executable, os.path.join(ROOT, "tests", "ops", "_kernel_resources.py"), str(tmp / "rows.json"),
                     *share], env=dict(env, TRITON_CACHE_DIR=str(tmp / "cache"), TRITON_DEFAULT_FP_FUSION="1"),
                    stdout=log, stderr=subprocess.STDOUT)
            procs.append((share, tmp, proc))
        deadline = time.monotonic() + 600
        results = {}
        for share, tmp, proc in procs:
            try:
                proc.wait(timeout=max(deadline - time.monotonic(), 0))
                ended = f"exited with status {proc.returncode}"
            except subprocess.TimeoutExpired:
                ended = "ran past 600 s"
            rows = tmp / "rows.json"
            done = json.loads(rows.read_text()) if rows.exists() else {}
            output = (tmp / "output.txt").read_text()[-3000:]
            for match in share:
                results[match] = done.get(match) or {
                    "stdout": "", "error": f"the process building {match!r} {ended} before it finished:\n{output}"}
    finally:
        for _, _, proc in procs:
            if proc.poll() is None:
                proc.kill()
                proc.wait()
    return results.__getitem__


def _resources(built, match: str, kernel: str) -> list:
    """bench_kernel_resources.py's rows for the variants whose name contains ``match``, as
    [name, tiles, registers, spill stack, shared, the op's tiles]."""
    result = built(match)
    assert not result["error"], result["error"][-3000:]
    return [[c.strip() for c in line.split("|")[1:-1]] for line in result["stdout"].splitlines()
            if kernel in line]


@pytest.mark.skipif(not os.path.exists(PTXAS), reason="this Triton has no bundled ptxas")
def test_siglip_gradient_with_loss_compiles_for_sm90(built):
    rows = _resources(built, "loss=True", "| siglip_grad")  # (not the Gluon kernel's row)
    assert {r[0] for r in rows} == {"siglip_grad pointer loss=True",
                                    "siglip_grad tma store=False loss=True",
                                    "siglip_grad tma store=True loss=True"}
    for name, _tiles, regs, _stack, shared, _ours in rows:
        assert 0 < int(regs) <= 255 and int(shared) > 0, name
    # the tiles the op runs this variant with do not spill kilobytes (4 KB a thread made the
    # pointer kernel 2x slower at B = 1k-2k on an H200; the TMA tiles' 0.5 KB cost nothing there)
    ours = [r for r in rows if r[5] == "yes"]
    assert len(ours) == 3, rows
    for name, tiles, _regs, stack, _shared, _ours in ours:
        assert int(stack) < 2048, f"{name} {tiles}: {stack} bytes of spill stack"


@pytest.mark.skipif(not os.path.exists(PTXAS), reason="this Triton has no bundled ptxas")
def test_clip_shift_launch_with_true_maxima_compiles_for_sm90(built):
    """The CLIP shift launch with the true maxima of loose shifts (tl.dots over whole rows, taken
    only where a shift is loose) compiles for sm_90 for each features' dtype and does not spill."""
    rows = _resources(built, "clip_shift", "clip_shift")
    assert {r[0] for r in rows} == {f"clip_shift tighten {t}" for t in ("bf16", "fp16", "fp32")}
    for name, tiles, regs, stack, shared, ours in rows:
        assert ours == "yes" and 0 < int(regs) <= 255, name
        assert int(stack) == 0, f"{name} {tiles}: {stack} bytes of spill stack"


@pytest.mark.skipif(not os.path.exists(PTXAS), reason="this Triton has no bundled ptxas")
def test_clip_gradient_slices_compile_for_sm90(built):
    """The CLIP gradient kernel with the op's tiles, its epilogue in column slices (SPLIT), TMA
    loads and stores, with and without the d-scale sum: it compiles for sm_90 and does not spill."""
    from infclip.ops.tuning import TUNING

    rows = _resources(built, "clip_grad tma", "clip_grad tma")
    split = TUNING.tma_grad[7] if len(TUNING.tma_grad) > 7 else 1
    assert {r[0] for r in rows} == {f"clip_grad tma split={split} dscale=1",
                                    f"clip_grad tma split={split} dscale=2"}
    for name, tiles, regs, stack, shared, ours in rows:
        assert ours == "yes" and 0 < int(regs) <= 255 and int(shared) > 0, name
        assert int(stack) == 0, f"{name} {tiles}: {stack} bytes of spill stack"


@pytest.mark.skipif(not os.path.exists(PTXAS), reason="this Triton has no bundled ptxas")
@pytest.mark.parametrize("label,most,most_dscale2", [("gluon_clip_grad", 16, 16), ("gluon_plain_clip_grad", 32, 0)])
def test_gluon_clip_gradient_compiles_for_sm90(built, label, most, most_dscale2):
    """The warp-specialised CLIP gradient kernel (bf16 with the d-scale sum or the single-device
    d scale, fp16 with neither), with its 64 x 128 tiles and with PLAIN's for the blocks without
    positives (128 x 128 tiles a consumer, two accumulators of 64 rows): it compiles for sm_90
    within its registers (168 a thread at launch), in the shared memory an H100 / H200 block may
    take, and spills at most ``most`` bytes, ``most_dscale2`` with the d-scale sums (larger tiles
    with the selects spilled hundreds and ran 2x slower; with PLAIN the d-scale terms' two sides
    summed apart spill none in this build or the device's Triton 3.6 one, where one sum of both
    spilled 192 bytes)."""
    from infclip.ops import gluon_kernels

    if gluon_kernels.available():
        pytest.skip(f"this Triton has no Gluon for Hopper: {gluon_kernels.available()}")
    rows = _resources(built, label, label)
    assert {r[0] for r in rows} == {f"{label} bf16 coef_scale=True dscale=1", f"{label} bf16 coef_scale=True dscale=2",
                                    f"{label} fp16 coef_scale=False dscale=0"}
    for name, tiles, regs, stack, shared, ours in rows:
        assert 0 < int(regs) <= 168 and 0 < int(shared) <= 227 * 1024, name
        bound = most_dscale2 if name.endswith("dscale=2") else most
        assert int(stack) <= bound, f"{name} {tiles}: {stack} bytes of spill stack"


@pytest.mark.skipif(not os.path.exists(PTXAS), reason="this Triton has no bundled ptxas")
def test_gluon_siglip_gradient_compiles_for_sm90(built):
    """The warp-specialised SigLIP gradient kernel with the pair losses in its epilogue (bf16 with
    the coefficient times scale, fp16 without): it compiles for sm_90 within 168 registers a
    thread, in the shared memory a block may take, and spills at most a few dozen bytes (32 in the
    build measured fastest; an order that kept -z and the losses' terms beside G spilled 560); its
    epilogue of the blocks without positives (PLAIN) at most a few (none under the device's Triton 3.6,
    where the other spills 176)."""
    from infclip.ops import gluon_kernels

    if gluon_kernels.available():
        pytest.skip(f"this Triton has no Gluon for Hopper: {gluon_kernels.available()}")
    rows = (_resources(built, "gluon_siglip", "gluon_siglip_grad")
            + _resources(built, "gluon_plain_siglip", "gluon_plain_siglip_grad"))
    assert {r[0] for r in rows} == {"gluon_siglip_grad bf16 coef_scale=True", "gluon_siglip_grad fp16 coef_scale=False",
                                    "gluon_plain_siglip_grad bf16 coef_scale=True",
                                    "gluon_plain_siglip_grad fp16 coef_scale=False"}
    for name, tiles, regs, stack, shared, ours in rows:
        assert 0 < int(regs) <= 168 and 0 < int(shared) <= 227 * 1024, name
        assert int(stack) <= (16 if "plain" in name else 64), f"{name} {tiles}: {stack} bytes of spill stack"


@pytest.mark.skipif(not os.path.exists(PTXAS), reason="this Triton has no bundled ptxas")
def test_gluon_clip_sums_compiles_for_sm90(built):
    """The warp-specialised forward sums at the widest features they take (their column block of B
    resident in shared memory beside the A ring): they compile for sm_90 within 168 registers a
    thread at launch, spill at most a hundred-odd bytes (the item's column vectors held across its
    tiles, stored and loaded once an item of up to 32 tiles: 88 bytes in this build, 96 in the
    device's Triton 3.6 one, where the tiles' loop spills nothing), and leave the shared memory that
    sums_stages keeps spare (Triton 3.6 on the device took ~3.5 KB more than this build: over the
    limit, the op would fall back to the Triton strips)."""
    from infclip.ops import gluon_kernels

    if gluon_kernels.available():
        pytest.skip(f"this Triton has no Gluon for Hopper: {gluon_kernels.available()}")
    rows = _resources(built, "gluon_clip_sums", "gluon_clip_sums")
    assert {r[0] for r in rows} == {f"gluon_clip_sums {t} D={gluon_kernels.SUMS_MAX_DIM}" for t in ("bf16", "fp16")}
    for name, tiles, regs, stack, shared, ours in rows:
        assert 0 < int(regs) <= 168 and int(stack) <= 128, f"{name} {tiles}: {regs} registers, {stack} spilled"
        assert 0 < int(shared) <= gluon_kernels.SHARED_BYTES - 4096, f"{name}: {shared} bytes of shared memory"
    assert gluon_kernels.sums_stages(gluon_kernels.SUMS_MAX_DIM, 2) >= 2


def test_gluon_log1p_is_the_triton_kernels_polynomial():
    """The Gluon SigLIP kernel's copy of the pairs' log1p (a Gluon kernel cannot call a Triton
    one) has the Triton kernel's lines: the same coefficients in the same FMAs, so both give the
    same pair losses; a coefficient changed in one file only fails here."""
    import inspect

    from infclip.ops import gluon_kernels, kernels_common

    if gluon_kernels.available():
        pytest.skip(f"this Triton has no Gluon for Hopper: {gluon_kernels.available()}")

    def body(jitted) -> list:
        lines = inspect.getsource(jitted.fn).split('"""')[-1].splitlines()
        return [line.strip() for line in lines if line.strip()]

    triton_body = body(kernels_common._log1p_unit)
    assert len(triton_body) == 8 and triton_body[0].startswith("p = 0.00525")
    assert body(gluon_kernels._log1p_unit) == triton_body
