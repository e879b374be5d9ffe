"""Distributed contrastive loss: real gloo process groups against one process on the whole batch.

Four real processes (one spawn) form groups of 1, 2, 3 and 4 ranks, each running every
scheme x dtype x loss (tests/ops/_dist_worker.py), and save their results; the tests here compare each rank's loss, its
feature-gradient slice (divided by the convention factor c = world size) and the averaged
logit_scale / logit_bias gradients with ``contrastive_loss(..., distributed="none")`` on the
global batch, and with an fp64 reference within twice torch's own low-precision error.
"""

from __future__ import annotations

import os
import time

import pytest
import torch
import torch.multiprocessing as mp

from infclip.ops import contrastive_loss, contrastive_loss_reference
from infclip.ops.tuning import TUNING
from tests._ranks import run_two_ranks
from tests.ops import _dist_worker as W

WORLDS = tuple(range(1, W.WORLD + 1))
SPAWN_TIMEOUT_S = 240


def _spawn(outdir: str) -> list:
    ctx = mp.start_processes(W.run, args=(outdir,), nprocs=W.WORLD, join=False,
                             start_method="spawn")
    deadline = time.monotonic() + SPAWN_TIMEOUT_S
    try:
        while not ctx.join(timeout=1):
            if time.monotonic() > deadline:
                raise TimeoutError(f"workers still running after {SPAWN_TIMEOUT_S} s")
    finally:
        for proc in ctx.processes:
            if proc.is_alive():
                proc.kill()
    return [torch.load(os.path.join(outdir, f"rank{r}.pt"), weights_only=True)
            for r in range(W.WORLD)]


_RESULTS: list = []


def results(world: int, tmp_path_factory) -> list:
    """Per-rank result dicts of the group of the first ``world`` ranks (one spawn per session;
    a failed spawn is not retried)."""
    if not _RESULTS:
        try:
            _RESULTS.append(_spawn(str(tmp_path_factory.mktemp("dist"))))
        except Exception as exc:
            _RESULTS.append(exc)
    if isinstance(_RESULTS[0], Exception):
        raise RuntimeError("the distributed workers failed") from _RESULTS[0]
    missing = [r for r in range(world) if world not in _RESULTS[0][r]]
    if missing:
        pytest.fail(f"world {world}: ranks {missing} did not run (an earlier group failed)")
    per_rank = [_RESULTS[0][r][world] for r in range(world)]
    for r, res in enumerate(per_rank):
        for name, value in res.items():
            if isinstance(value, dict) and "error" in value:
                pytest.fail(f"world {world} rank {r} stopped at {name}:\n{value['error']}")
    return per_rank


def _single(spec, n_members: int, dtype_override=None, reference: bool = False, blocks=(0, 0)):
    """One process on the whole batch: the project's op (or the full-matrix reference in
    ``dtype_override``). Returns loss, img_grad, txt_grad, scale_grad[, bias_grad]."""
    dtype = W.DTYPES[spec["dtype"]]
    img, txt = W.global_batch(n_members * W.LOCAL_B, dtype, overflow=spec["overflow"],
                              wide=spec.get("wide", ""))
    work = dtype_override or dtype
    img = img.to(work).requires_grad_(True)
    txt = txt.to(work).requires_grad_(True)
    scale = torch.tensor([spec["scale"]], dtype=torch.float64 if work == torch.float64 else torch.float32,
                         requires_grad=True)
    bias = (torch.tensor([W.BIAS], dtype=scale.dtype, requires_grad=True)
            if spec["loss"] == "siglip" else None)
    if reference:
        loss = contrastive_loss_reference(img, txt, scale, bias, loss=spec["loss"],
                                          label_smoothing=spec["eps"])
    else:
        loss = contrastive_loss(img, txt, scale, bias, loss=spec["loss"], impl="chunked_torch",
                                label_smoothing=spec["eps"], block_m=blocks[0], block_n=blocks[1])
    (loss * W.UPSTREAM).backward()
    out = dict(loss=loss.detach(), img_grad=img.grad, txt_grad=txt.grad, scale_grad=scale.grad)
    if bias is not None:
        out["bias_grad"] = bias.grad
    return out


def _gather_ranks(per_rank: list, members: list, factor: float) -> dict:
    """Rebuild full-batch gradients from the members' slices; the parameter gradients as the
    framework would reduce them (mean: average; sum: sum)."""
    out = {"img_grad": torch.cat([per_rank[r]["img_grad"] for r in members]).float() / factor,
           "txt_grad": torch.cat([per_rank[r]["txt_grad"] for r in members]).float() / factor}
    for key in ("scale_grad", "bias_grad"):
        if key in per_rank[members[0]]:
            stacked = torch.stack([per_rank[r][key] for r in members]).float()
            out[key] = stacked.mean(0) if factor != 1 else stacked.sum(0)
    return out


def _wide_slack(spec: dict, big: float) -> float:
    """What a gradient of a ``wide`` case may carry beyond fp32's summation order (the cases of
    tests/ops/test_loss_exactness.py, which says why): |S|_max 2^-20 of its largest element, and
    2^-20 of the terms it sums (up to g |s| |T| or g |S'|: a gradient that cancels to ~0)."""
    if not spec.get("wide"):
        return 0.0
    norm = W.WIDE_NORMS[1] if spec["wide"] == "norms" else 1.0
    scale = abs(spec["scale"])
    return 2.0**-20 * (scale * norm**2 * big + W.UPSTREAM * max(scale * norm, norm**2))


def _check_case(name: str, spec: dict, per_rank: list, world: int) -> None:
    members = (W.interleaved_groups(world)[0] if spec["group"] == "interleaved" else list(range(world)))
    n = len(members)
    per_rank = [results_of_rank[name] for results_of_rank in per_rank]
    single = _single(spec, n)
    ref64 = _single(spec, n, torch.float64, reference=True)
    lowp = _single(spec, n, W.DTYPES[spec["dtype"]], reference=True)
    # every rank returns the same global loss, equal to the one-process loss (fp32 accumulation
    # in both: summation order only)
    losses = torch.stack([per_rank[r]["loss"] for r in members])
    assert torch.all(losses == losses[0]), f"{name}: ranks disagree on the loss: {losses}"
    torch.testing.assert_close(losses[0], single["loss"], rtol=2e-6, atol=2e-6)
    if spec.get("strips"):  # every gradient block of every rank summed its share of d scale
        flags = [per_rank[r]["dscale_summed"] for r in members]
        if spec["strips"] == "mixed":  # all but the rank's own block
            assert all(f.numel() > 1 and int((~f).sum()) == 1 for f in flags), f"{name}: {flags}"
        else:
            assert all(f.numel() and bool(f.all()) for f in flags), f"{name}: dscale_summed {flags}"
        assert all(per_rank[r]["twice_equal"] for r in members), f"{name}: a second backward differs"
    factor = n if spec["reduction"] == "mean" else 1
    got = _gather_ranks(per_rank, members, factor)
    bf16 = spec["dtype"] == "bf16"
    for key, value in got.items():
        want = single[key].float()
        big = want.abs().max().item()
        wide = _wide_slack(spec, ref64[key].abs().max().item())
        if bf16 and key in ("img_grad", "txt_grad"):
            # both are one bf16 rounding of the same fp32 value; ours is rounded after the
            # factor c, so they can differ by one bf16 ulp (2^-8 relative) per element
            tol = 2.0**-7 * want.abs() + 1e-6 * big
        elif key in ("scale_grad", "bias_grad"):
            # a sum over the B^2 logits of terms <= g in size (for CLIP, cancelling down to a small
            # result): fp32 rounding is relative to g * B, not to the result
            tol = 2e-5 * want.abs() + 1e-6 * W.UPSTREAM * n * W.LOCAL_B
        else:
            tol = 2e-5 * want.abs() + 2e-6 * big  # fp32 summation order
        tol = tol + wide
        err = (value - want).abs()
        assert bool((err <= tol).all()), (
            f"{name}: {key} differs from one process by {err.max().item():.3g} "
            f"(at {int(err.argmax())}; scale {big:.3g})")
        # and against fp64 within twice torch's own error at this dtype (STYLE 8); the atol
        # covers fp32 rounding noise where torch's fp32 error is ~0 by luck
        ref = ref64[key].float()
        torch_err = (lowp[key].float() - ref).abs().max().item()
        our_err = (value - ref).abs().max().item()
        assert our_err <= 2 * torch_err + 1e-5 * ref.abs().max().item() + 1e-7 + wide, (
            f"{name}: {key} error vs fp64 {our_err:.3g} > 2 x torch's {torch_err:.3g}")


@pytest.mark.parametrize("world", WORLDS)
def test_schemes_match_single_process(world, tmp_path_factory):
    per_rank = results(world, tmp_path_factory)
    names = list(W.cases(world))
    failures = []
    for name in names:
        try:
            _check_case(name, W.cases(world)[name], per_rank, world)
        except AssertionError as exc:
            failures.append(str(exc))
    assert not failures, f"{len(failures)}/{len(names)} cases failed:\n" + "\n".join(failures)


def test_case_grid_covers_every_scheme_dtype_loss():
    names = set(W.cases(4))
    for scheme in ("gather", "disco", "ring", "hierarchical_ring"):
        for dtype in W.DTYPES:
            for loss in W.LOSSES:
                assert any(n.startswith(scheme) and f"-{dtype}-{loss}" in n for n in names)
    # the 2 nodes x 2 ranks topology
    assert "hierarchical_ring-L2-bf16-clip_ls" in names


@pytest.mark.parametrize("world", (2, 3, 4))
def test_uneven_local_batch_is_a_clear_error_on_every_rank(world, tmp_path_factory):
    per_rank = results(world, tmp_path_factory)
    for r in range(world):
        for scheme in ("gather", "disco", "ring", "hierarchical_ring"):
            msg = per_rank[r]["errors"][f"uneven-{scheme}"]
            assert "same local batch" in msg, f"rank {r} {scheme}: {msg}"
            assert f"rank {world - 1}: {W.LOCAL_B + 1} x {W.DIM}" in msg, msg
            assert f"rank 0: {W.LOCAL_B} x {W.DIM}" in msg, msg


def test_bad_local_world_size_is_a_clear_error(tmp_path_factory):
    per_rank = results(4, tmp_path_factory)
    for r in range(4):
        msg = per_rank[r]["errors"]["bad-local"]
        assert "local_world_size=3" in msg and "4 ranks" in msg, msg


def test_world_size_1_is_the_single_process_op(tmp_path_factory):
    (res,) = results(1, tmp_path_factory)
    res = res["world1"]
    spec = dict(dtype="fp32", loss="clip", eps=0.1, scale=W.SCALE, overflow=False)
    single = _single(spec, 1, blocks=(W.BLOCK_M, W.BLOCK_N))
    for scheme in ("gather", "disco", "ring", "hierarchical_ring"):
        api = res[f"world1-api-{scheme}"]
        for key in ("loss", "img_grad", "txt_grad", "scale_grad"):
            assert torch.equal(api[key], single[key]), f"{scheme} {key}"
            torch.testing.assert_close(res[f"world1-direct-{scheme}"][key], single[key],
                                       rtol=2e-6, atol=1e-7)


def test_compiled_fullgraph_matches_eager(tmp_path_factory):
    """torch.compile(fullgraph=True) of contrastive_loss(distributed=...) on 2 gloo ranks: the
    registered op is one opaque node (a graph break would raise), and loss and gradients equal
    eager's on every rank."""
    per_rank = results(2, tmp_path_factory)
    for r in range(2):
        compiled = per_rank[r]["compiled"]
        assert len(compiled) == len(W.scheme_variants(2)) + 2
        for name, res in compiled.items():
            for key, want in res["eager"].items():
                torch.testing.assert_close(res["compiled"][key], want, rtol=1e-6, atol=1e-7,
                                           msg=lambda m: f"rank {r} {name} {key}: {m}")


def test_distributed_op_passes_opcheck(tmp_path_factory):
    (res,) = results(1, tmp_path_factory)
    assert set(res["opcheck"].values()) == {"ok"} and len(res["opcheck"]) == 5


@pytest.mark.parametrize("loss,eps", [("clip", 0.0), ("clip", 0.1), ("siglip", 0.0)])
def test_local_sweep_through_the_distributed_entry_is_the_single_device_loss(loss, eps):
    """Scheme "none" (the Local sweep: every block on this device, no process group) through
    distributed_contrastive_loss gives the single-device loss and gradients (the same op), and
    the op passes opcheck with the scheme's arguments spelled out."""
    from infclip.ops.contrastive_loss import distributed_contrastive_loss

    img_all, txt_all = W.global_batch(3 * W.LOCAL_B, torch.float32)

    def run(fn):
        img, txt = img_all.clone().requires_grad_(True), txt_all.clone().requires_grad_(True)
        scale = torch.tensor([W.SCALE], requires_grad=True)
        bias = torch.tensor([W.BIAS], requires_grad=True) if loss == "siglip" else None
        out = fn(img, txt, scale, bias)
        (out * W.UPSTREAM).backward()
        grads = [out.detach(), img.grad, txt.grad, scale.grad]
        return grads + ([bias.grad] if bias is not None else [])

    kw = dict(loss=loss, impl="chunked_torch", label_smoothing=eps, block_m=W.BLOCK_M,
              block_n=W.BLOCK_N)
    want = run(lambda i, t, s, b: contrastive_loss(i, t, s, b, **kw))
    got = run(lambda i, t, s, b: distributed_contrastive_loss(i, t, s, b, scheme="none", **kw))
    for g, w in zip(got, want):
        torch.testing.assert_close(g, w, rtol=0, atol=0)
    bias = torch.tensor([W.BIAS], requires_grad=True) if loss == "siglip" else None
    args = (img_all.clone().requires_grad_(True), txt_all.clone().requires_grad_(True),
            torch.tensor([W.SCALE], requires_grad=True), bias, loss, "chunked_torch", eps,
            W.BLOCK_M, W.BLOCK_N, False, 0.0, False, "none", "", 0, "mean")
    torch.library.opcheck(torch.ops.infclip.contrastive_loss.default, args)
    if loss == "siglip":  # the forward that takes the gradients (grads_in_forward)
        eager = args[:11] + (True,) + args[12:]
        torch.library.opcheck(torch.ops.infclip.contrastive_loss.default, eager)


@pytest.mark.parametrize("impl", ["chunked_torch", "triton"])
def test_siglip_sweeps_once_when_a_backward_follows(monkeypatch, impl):
    """SigLIP sweeps the blocks once, in the forward, when a backward will follow: the backward
    runs no sweep (no ring round, no gather) and gives the gradients of the two-sweep path (bit
    for bit in torch: the same block sums, scaled the same way); under no_grad the forward runs
    the statistics sweep and the loss agrees. Through the Local sweep (scheme "none" on the
    distributed entry) and through the single-device entry."""
    from infclip.ops import assembly, sweeps
    from infclip.ops.contrastive_loss import distributed_contrastive_loss

    img_all, txt_all = W.global_batch(3 * W.LOCAL_B, torch.float32)
    sweeps_run = []
    columns = sweeps.Local.columns
    monkeypatch.setattr(sweeps.Local, "columns", lambda self, *a, **k: (sweeps_run.append(1), columns(self, *a, **k))[1])
    kw = dict(loss="siglip", impl=impl, block_m=W.BLOCK_M, block_n=W.BLOCK_N)
    entries = {"distributed": lambda *a: distributed_contrastive_loss(*a, scheme="none", **kw),
               "local": lambda *a: contrastive_loss(*a, **kw, triton_interpret=impl == "triton")}

    def run(entry, one_sweep):
        monkeypatch.setattr(TUNING, "siglip_grads_in_forward", one_sweep)
        img, txt = img_all.clone().requires_grad_(True), txt_all.clone().requires_grad_(True)
        scale, bias = torch.tensor([W.SCALE], requires_grad=True), torch.tensor([W.BIAS], requires_grad=True)
        sweeps_run.clear()
        calls = []
        real = assembly.siglip_forward_with_grads
        monkeypatch.setattr(assembly, "siglip_forward_with_grads", lambda *a: (calls.append(1), real(*a))[1])
        out = entries[entry](img, txt, scale, bias)
        forward = len(sweeps_run)
        (out * W.UPSTREAM).backward()
        monkeypatch.setattr(assembly, "siglip_forward_with_grads", real)
        return forward, len(sweeps_run) - forward, len(calls), [out.detach(), img.grad, txt.grad, scale.grad, bias.grad]

    for entry in entries:
        fwd, bwd, took, eager = run(entry, True)
        assert (fwd, bwd, took) == (1, 0, 1), entry
        fwd, bwd, took, two_pass = run(entry, False)
        assert (fwd, bwd, took) == (1, 1, 0), entry
        # triton: the gradient kernel with the loss takes sigmoid from the softplus's exponential
        tol = dict(rtol=0, atol=0) if impl == "chunked_torch" else dict(rtol=1e-5, atol=1e-7)
        for got, want in zip(eager, two_pass):
            torch.testing.assert_close(got, want, **tol)
        with torch.no_grad():
            alone = entries[entry](img_all, txt_all, torch.tensor([W.SCALE]), torch.tensor([W.BIAS]))
        torch.testing.assert_close(alone, eager[0], rtol=1e-6, atol=0)


def test_scheme_is_parsed_in_one_place():
    """Every ``distributed`` value maps to one sweep class; unknown names fail there."""
    from infclip.ops import sweeps

    assert sweeps.SCHEMES == ("gather", "disco", "ring", "hierarchical_ring")
    kinds = {name: sweeps.sweep_class(name) for name in ("none",) + sweeps.SCHEMES}
    assert kinds["gather"].gathers_rows and kinds["gather"].gathers_columns
    assert kinds["disco"].gathers_columns and not kinds["disco"].gathers_rows
    assert not kinds["ring"].gathers_columns and issubclass(kinds["hierarchical_ring"], kinds["ring"])
    assert sweeps.choose_scheme("ring").local  # no process group here: every block local
    with pytest.raises(ValueError, match="unknown distributed scheme 'rign'"):
        sweeps.sweep_class("rign")


def test_the_op_turns_its_scheme_arguments_into_the_scheme_once():
    """The registered op's primitive scheme arguments come back as the Scheme the public API
    chose, with its sweep class: the name checked once per distinct value (cached), not per call."""
    from infclip.ops import sweeps

    sweeps.scheme_of.cache_clear()
    scheme = sweeps.scheme_of("hierarchical_ring", "g", 2)
    assert scheme == sweeps.Scheme("hierarchical_ring", "g", 2) and not scheme.local
    assert scheme.sweep_class is sweeps.HierarchicalRing
    assert sweeps.scheme_of("hierarchical_ring", "g", 2) is scheme
    assert sweeps.scheme_of.cache_info().misses == 1
    assert sweeps.scheme_of("none").local and sweeps.scheme_of("none").sweep_class is sweeps.Local
    with pytest.raises(ValueError, match="unknown distributed scheme 'rign'"):
        sweeps.scheme_of("rign")


@pytest.mark.parametrize("world", WORLDS)
def test_ring_schedules_visit_every_block_once_in_the_documented_order(world, tmp_path_factory):
    """docs/distributed.md: flat ring, rank r at step t holds block (r - t) mod N; hierarchical,
    rank (m, l) at outer step u, inner step v holds block ((m - u) mod M) L + (l - v) mod L."""
    per_rank = results(world, tmp_path_factory)
    for name, local in (("ring", world), ("hier-L2", 2), ("hier-L1", 1), ("hier-env", 2)):
        if world % local or name == "hier-env" and world != 4:
            continue
        assert per_rank[0]["schedules"][name]["local"] == local, name
        nodes = world // local
        for r in range(world):
            node, lr = divmod(r, local)
            want = [((node - u) % nodes) * local + (lr - v) % local
                    for u in range(nodes) for v in range(local)]
            got = per_rank[r]["schedules"][name]
            assert got["seen"].tolist() == want, f"{name} rank {r}"
            assert got["data"].tolist() == want, f"{name} rank {r}: a block arrived with wrong data"
            assert torch.equal(got["home"], torch.full((W.LOCAL_B,), float(sum(range(1, world + 1)))))


@pytest.mark.parametrize("world", [w for w in WORLDS if w > 1])
def test_disco_schedules_compute_every_block_once_and_sum_at_the_owner(world, tmp_path_factory):
    """Pipelined (TUNING.disco_pipelined): where something is gathered rank r computes its own
    block first, on its own tensors, then every other block in rank order (the order of the
    reduces to each owner); with everything kept, all blocks in rank order; in one step: the
    whole gathered batch once. Each step holds its owners' data, and the owner's partials are the
    sum over ranks, also when the features are reused from an earlier call."""
    per_rank = results(world, tmp_path_factory)
    for r in range(world):
        gathering = [r] + [q for q in range(world) if q != r]
        for name, want in (("disco", gathering * 2 + list(range(world))), ("disco-one-step", [0] * 3)):
            got = per_rank[r]["schedules"][name]
            assert got["seen"].tolist() == want, f"{name} rank {r}"
            for first, held in zip(want, got["held"]):
                rows = held.shape[1] // W.LOCAL_B
                owners = torch.arange(first, first + rows).repeat_interleave(W.LOCAL_B).float()
                assert torch.equal(held, torch.stack([owners, owners])), f"{name} rank {r}: wrong data"
            for home in got["homes"]:
                assert torch.equal(home, torch.full((W.LOCAL_B, 3), float(sum(range(1, world + 1))))), name


def test_launcher_local_world_size_precedence(monkeypatch):
    from infclip.ops.sweeps import launcher_local_world_size

    for name in ("LOCAL_WORLD_SIZE", "LOCAL_SIZE", "OMPI_COMM_WORLD_LOCAL_SIZE"):
        monkeypatch.delenv(name, raising=False)
    assert launcher_local_world_size() is None
    monkeypatch.setenv("OMPI_COMM_WORLD_LOCAL_SIZE", "4")
    assert launcher_local_world_size() == 4
    monkeypatch.setenv("LOCAL_SIZE", "8")  # deepspeed launcher
    assert launcher_local_world_size() == 8
    monkeypatch.setenv("LOCAL_WORLD_SIZE", "2")  # torchrun
    assert launcher_local_world_size() == 2


@pytest.mark.parametrize("loss", ["clip", "siglip"])
def test_benchmark_checks_each_scheme_against_one_device(tmp_path, loss):
    """bench/bench_distributed.py --smoke (2 gloo ranks, fp32): every scheme's row carries its
    loss and gradient error against the single-device op on the same rows, and they are at fp32
    rounding level (the benchmark's check of the schemes over NCCL runs the same code)."""
    import json

    out = tmp_path / "rows.jsonl"
    proc = run_two_ranks(["bench/bench_distributed.py", "--smoke", "--dtype", "fp32", "--reps", "1", "--profile", "1",
                          "--loss", loss, "--out", str(out)], timeout=240)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-3000:]
    # a world group left to interpreter exit aborts a gloo rank only now and then: fail every time
    assert "outlived destroy_process_group" not in proc.stderr, proc.stderr[-3000:]
    rows = [json.loads(line) for line in out.read_text().splitlines()]
    assert {r["loss"] for r in rows} == {loss}
    schemes = [r for r in rows if r["scheme"] != "single"]
    assert {r["scheme"] for r in schemes} == {"gather", "disco", "ring", "hierarchical_ring"}
    for r in schemes:
        for key in ("loss_rel_err", "grad_rel_err", "scale_grad_rel_err"):
            assert 0 <= r[key] < 1e-5, (r["scheme"], r["global_batch"], key, r[key])
        # --profile: rank 0 prints where each scheme's call spends its time, collectives included
        head = f"# profile {r['scheme']} B={r['global_batch']} b={r['local_batch']}: 1 calls"
        assert proc.stdout.count(head) == 1, head
    assert "Self CPU" in proc.stdout and "c10d::" in proc.stdout  # the collectives are in the tables
