"""Worker processes for tests/ops/test_distributed.py: real gloo process groups.

One spawn of ``WORLD`` processes; inside it, groups of the first n ranks for n = 1 .. WORLD
(n = WORLD is the default group, the others are passed explicitly as ``process_group``), so
one set of process start-ups serves every world size. Each rank builds the same global batch
from a seed (``global_batch``), takes its slice, runs every case of ``cases(n)`` through
``ops.contrastive_loss(..., distributed=scheme)`` and backward with an upstream gradient != 1,
and writes {n: {case: {loss, grads} or {error}}} to ``<outdir>/rank<r>.pt`` for the parent to
compare with one process on the whole batch.
"""

from __future__ import annotations

import contextlib
import datetime
import os
import traceback

import torch
import torch.distributed as dist

from infclip.ops import contrastive_loss, process_groups
from infclip.ops.contrastive_loss import distributed_contrastive_loss
from infclip.ops.tuning import tuning

WORLD = 4
LOCAL_B = 5  # rows per rank: not a multiple of the tiles below
DIM = 12
BLOCK_M, BLOCK_N = 3, 4  # uneven last tiles inside each b x b block
SCALE, BIAS, UPSTREAM = 7.3, -3.0, 0.37
DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16}
LOSSES = {"clip": ("clip", 0.0), "clip_ls": ("clip", 0.1), "siglip": ("siglip", 0.0)}


WIDE_NORMS = (0.1, 3.0)


def global_batch(n_rows: int, dtype: torch.dtype, seed: int = 0, overflow: bool = False,
                 wide: str = ""):
    """L2-normalised (img, txt) [n_rows, DIM] in ``dtype``. ``overflow``: rows 0 and 1 are made
    so that, at scale 100, logit (1, 0) exceeds the diagonal logit (0, 0) by ~200 (the stats
    with diagonal shifts overflow and every rank must switch to exact maxima). ``wide``: "" or
    "unit", as said; "norms", every row scaled to a norm log-uniform in WIDE_NORMS; "antipodal",
    every image row (1, 0, ...) and every text row (-1, 0, ...) (at scale 100 each logit sits 200
    below its bound: every shift is loose)."""
    gen = torch.Generator().manual_seed(seed)
    img = torch.randn(n_rows, DIM, generator=gen)
    txt = img + 0.8 * torch.randn(n_rows, DIM, generator=gen)
    if overflow:
        txt[0] = -img[0]
        img[n_rows - 1] = -img[0]
    if wide == "antipodal":
        img = torch.zeros(n_rows, DIM)
        img[:, 0] = 1.0
        txt = -img
    img = torch.nn.functional.normalize(img, dim=-1)
    txt = torch.nn.functional.normalize(txt, dim=-1)
    if wide == "norms":
        lo, hi = (torch.tensor(v).log() for v in WIDE_NORMS)
        for x in (img, txt):
            x.mul_(torch.exp(lo + (hi - lo) * torch.rand(n_rows, 1, generator=gen)))
    return img.to(dtype), txt.to(dtype)


WIDE = {"negscale": (-1e4, "unit"), "norms": (50.0, "norms"), "antipodal": (100.0, "antipodal")}
"""The inputs outside training's range that every scheme must still get right: name -> (scale,
global_batch's ``wide``)."""


def scheme_variants(world: int):
    """(scheme, local_world_size) pairs to run at this world size."""
    out = [("gather", None), ("disco", None), ("ring", None)]
    out += [("hierarchical_ring", L) for L in sorted({1, 2, world}) if L <= world and world % L == 0]
    return out


def cases(world: int):
    """name -> dict(scheme, local, dtype, loss, eps, scale, reduction, group, overflow)."""
    out = {}
    for scheme, local in scheme_variants(world):
        for dname in DTYPES:
            for lname, (loss, eps) in LOSSES.items():
                out[f"{scheme}-L{local}-{dname}-{lname}"] = dict(
                    scheme=scheme, local=local, dtype=dname, loss=loss, eps=eps, scale=SCALE,
                    reduction="mean", group=None, overflow=False)
    for scheme, local in scheme_variants(world):
        # loose shifts made tight by a max sweep: a negative scale of 1e4, norms 0.1 to 3, rows
        # whose every logit sits 200 below its bound
        for wname, (scale, wide) in WIDE.items():
            for dname in DTYPES:
                out[f"wide_{wname}-{scheme}-L{local}-{dname}"] = dict(
                    scheme=scheme, local=local, dtype=dname, loss="clip", eps=0.0, scale=scale,
                    reduction="mean", group=None, overflow=False, wide=wide)
            if world == 2 and triton_interpreting():
                out[f"triton_wide_{wname}-{scheme}-L{local}"] = dict(
                    scheme=scheme, local=local, dtype="fp32", loss="clip", eps=0.0, scale=scale,
                    reduction="mean", group=None, overflow=False, wide=wide, impl="triton")
        # scale 100 with a logit 200 above its diagonal: the exact-max fallback, on every rank
        out[f"overflow-{scheme}-L{local}"] = dict(
            scheme=scheme, local=local, dtype="fp32", loss="clip", eps=0.0, scale=100.0,
            reduction="mean", group=None, overflow=True)
        # grad_reduction "sum": factor 1 instead of the world size
        out[f"sum-{scheme}-L{local}"] = dict(
            scheme=scheme, local=local, dtype="fp32", loss="clip", eps=0.1, scale=SCALE,
            reduction="sum", group=None, overflow=False)
    if world == 2 and triton_interpreting():
        # the Triton kernels through the CPU interpreter (fp32: bf16 dots need a GPU there)
        for scheme, local in scheme_variants(world):
            for lname, (loss, eps) in LOSSES.items():
                out[f"triton-{scheme}-L{local}-{lname}"] = dict(
                    scheme=scheme, local=local, dtype="fp32", loss=loss, eps=eps, scale=SCALE,
                    reduction="mean", group=None, overflow=False, impl="triton")
            # the TMA kernels forced (as on Hopper): the forward takes the plain sums by column
            # strips and the backward's gradient kernels sum d scale, block by block
            if scheme != "gather":
                for lname in ("clip", "clip_ls"):
                    out[f"strips-{scheme}-L{local}-{lname}"] = dict(
                        scheme=scheme, local=local, dtype="fp32", loss="clip", eps=LOSSES[lname][1],
                        scale=SCALE, reduction="mean", group=None, overflow=False, impl="triton",
                        strips=True)
            # the rank's own block without the strips (as for a misaligned text tensor): its
            # forward takes the weighted sums, the other blocks' backward sums d scale
            if scheme in ("ring", "hierarchical_ring"):
                out[f"strips_mixed-{scheme}-L{local}-clip_ls"] = dict(
                    scheme=scheme, local=local, dtype="fp32", loss="clip", eps=0.1, scale=SCALE,
                    reduction="mean", group=None, overflow=False, impl="triton", strips="mixed")
    if world == 4:
        # a group that is not the world, with non-consecutive members: {0, 2} and {1, 3}
        for scheme, local in (("ring", None), ("disco", None), ("gather", None),
                              ("hierarchical_ring", 1), ("hierarchical_ring", 2)):
            for lname, (loss, eps) in LOSSES.items():
                out[f"subgroup-{scheme}-L{local}-{lname}"] = dict(
                    scheme=scheme, local=local, dtype="fp32", loss=loss, eps=eps, scale=SCALE,
                    reduction="mean", group="interleaved", overflow=False)
            # the same members as the world but another group object: sub-group layouts are
            # gathered from every rank before the sub-groups are made
        for lname, (loss, eps) in LOSSES.items():
            out[f"copy-hierarchical_ring-L2-{lname}"] = dict(
                scheme="hierarchical_ring", local=2, dtype="fp32", loss=loss, eps=eps,
                scale=SCALE, reduction="mean", group="copy", overflow=False)
    return out


@contextlib.contextmanager
def _strips(on, own):
    """With ``on``: the triton impl's TMA kernels forced (the interpreter, fp32 rows of 48 bytes)
    and the column-strip sums from any size, so the CLIP forward leaves d scale to the backward;
    "mixed": except for the blocks whose columns are ``own`` (the rank's text features); yields
    the ``dscale_summed`` of each gradient-kernel call (else None)."""
    if not on:
        yield None
        return
    from infclip.ops import contrastive_loss_triton as tri

    saved = {k: getattr(tri, k) for k in ("clip_grads_triton", "sums_in_strips")}
    summed = []

    def grads(*args, **kw):
        summed.append(bool(kw.get("dscale_summed")))
        return saved["clip_grads_triton"](*args, **kw)

    def strips(a, b, keep):
        return saved["sums_in_strips"](a, b, keep) and not (on == "mixed" and b.data_ptr() == own.data_ptr())

    tri.clip_grads_triton, tri.sums_in_strips = grads, strips
    try:
        with tuning(tma_force=True, strips_min_logits=0):
            yield summed
    finally:
        for k, v in saved.items():
            setattr(tri, k, v)


def triton_interpreting() -> bool:
    """The triton impl can run on CPU only when TRITON_INTERPRET=1 was set before import."""
    try:
        import triton  # noqa: F401
    except ImportError:
        return False
    return os.environ.get("TRITON_INTERPRET") == "1"


def interleaved_groups(world: int):
    """Group members (global ranks) of the 'interleaved' subgroups: even ranks, odd ranks."""
    return [list(range(0, world, 2)), list(range(1, world, 2))]


def _run_case(spec, rank, world, group, extra):
    """extra: {"interleaved": [even-rank group, odd-rank group], "copy": world-members group}."""
    interleaved = spec["group"] == "interleaved"
    members = interleaved_groups(world)[rank % 2] if interleaved else list(range(world))
    if spec["group"]:
        group = extra["interleaved"][rank % 2] if interleaved else extra["copy"]
    if spec["group"] == "copy":  # every rank at once: the sub-groups are made anew from gathered layouts
        process_groups._SUBGROUPS.clear()
    pos = members.index(rank)
    dtype = DTYPES[spec["dtype"]]
    img_all, txt_all = global_batch(len(members) * LOCAL_B, dtype, overflow=spec["overflow"],
                                    wide=spec.get("wide", ""))
    rows = slice(pos * LOCAL_B, (pos + 1) * LOCAL_B)
    img = img_all[rows].clone().requires_grad_(True)
    txt = txt_all[rows].clone().requires_grad_(True)
    scale = torch.tensor([spec["scale"]], requires_grad=True)
    bias = torch.tensor([BIAS], requires_grad=True) if spec["loss"] == "siglip" else None
    impl = spec.get("impl", "chunked_torch")
    blocks = (16, 16) if impl == "triton" else (BLOCK_M, BLOCK_N)  # triton tiles: powers of 2 >= 16
    with _strips(spec.get("strips", False), txt) as summed:
        loss = contrastive_loss(img, txt, scale, bias, loss=spec["loss"], impl=impl,
                                triton_interpret=impl == "triton", label_smoothing=spec["eps"],
                                block_m=0 if summed is not None else blocks[0],
                                block_n=0 if summed is not None else blocks[1],
                                distributed=spec["scheme"], process_group=group,
                                local_world_size=spec["local"], grad_reduction=spec["reduction"])
        (loss * UPSTREAM).backward(retain_graph=summed is not None)
        first = list(summed or ())
        # a second backward over the same saved tensors (retain_graph): the same gradients (the
        # accumulated d scale must not land in what the forward saved)
        again = torch.autograd.grad(loss * UPSTREAM, (img, txt, scale)) if summed is not None else ()
    out = dict(loss=loss.detach(), img_grad=img.grad, txt_grad=txt.grad, scale_grad=scale.grad)
    if summed is not None:
        out["dscale_summed"] = torch.tensor(first, dtype=torch.bool)
        out["twice_equal"] = all(torch.equal(a, b) for a, b in zip(again, (img.grad, txt.grad, scale.grad)))
    if bias is not None:
        out["bias_grad"] = bias.grad
    return out


def _error_cases(rank, world, group):
    """Bad input must fail on every rank with a clear message (not hang)."""
    out = {}
    img, txt = global_batch(world * LOCAL_B + 1, torch.float32)
    scale = torch.tensor([SCALE])
    for scheme in ("gather", "disco", "ring", "hierarchical_ring"):
        n = LOCAL_B + 1 if rank == world - 1 else LOCAL_B  # the last rank has one row more
        try:
            contrastive_loss(img[:n], txt[:n], scale, impl="chunked_torch", distributed=scheme,
                             process_group=group)
            out[f"uneven-{scheme}"] = "no error"
        except ValueError as exc:
            out[f"uneven-{scheme}"] = str(exc)
    if world == 4:
        try:
            contrastive_loss(img[:LOCAL_B], txt[:LOCAL_B], scale, impl="chunked_torch",
                             distributed="hierarchical_ring", local_world_size=3,
                             process_group=group)
            out["bad-local"] = "no error"
        except ValueError as exc:
            out["bad-local"] = str(exc)
    return out


def _schedules(world, group):
    """The order in which each rank meets the column blocks (block index = owner's rank), and
    the home partials: each rank adds 1 + its rank into every block's column partial, so the
    owner must get sum_r (1 + r) whatever the route."""
    from infclip.ops.sweeps import make_sweep, ring_sweep

    out = {}
    for name, scheme, local in (("ring", "ring", None), ("hier-L2", "hierarchical_ring", 2),
                                ("hier-L1", "hierarchical_ring", 1), ("hier-env", "hierarchical_ring", None)):
        if local is not None and world % local or name == "hier-env" and world != 4:
            continue
        # the launcher variables this process inherited (an in-process launch/pretrain.py test
        # sets LOCAL_WORLD_SIZE=1 for its single process) must not decide the layout here
        saved = {k: os.environ.pop(k) for k in ("LOCAL_WORLD_SIZE", "LOCAL_SIZE", "OMPI_COMM_WORLD_LOCAL_SIZE")
                 if k in os.environ}
        if name == "hier-env":  # the deepspeed launcher's variable: 2 nodes x 2
            os.environ["LOCAL_SIZE"] = "2"
        try:
            topo = make_sweep(scheme, group, local).topo
        finally:
            os.environ.pop("LOCAL_SIZE", None)
            os.environ.update(saved)
        seen = []
        block = [torch.full((LOCAL_B, 2), float(topo.rank))]

        def step(col_offset, held):
            seen.append(col_offset // LOCAL_B)
            # the data that arrived: its owner's rank (must equal the block index)
            seen.append(int(held[0][0, 0]))
            return [torch.full((LOCAL_B,), 1.0 + topo.rank)]

        (home,) = ring_sweep(topo, block, step)
        out[name] = dict(seen=torch.tensor(seen[0::2]), data=torch.tensor(seen[1::2]), home=home,
                         local=topo.local)
    out.update(_disco_schedules(world, group))
    return out


def _disco_schedules(world, group):
    """disco's steps, pipelined and in one step: the blocks (first column / b) in the order each
    rank computes them, the owners whose data each step held (per row of its features: the
    gathered block's rows in place), the home partials ([b, 3], each rank adds 1 + its rank:
    sum_r (1 + r) at the owner), three times: gathering everything, with the features kept from
    the first call (the backward's reuse; the per-column vector gathered again), with both kept."""
    from infclip.ops import sweeps

    out = {}
    for name, pipelined in (("disco", True), ("disco-one-step", False)):
        with tuning(disco_pipelined=pipelined):
            sw = sweeps.make_sweep("disco", group)
            rank = sw.rank
            block = [torch.full((LOCAL_B, 2), float(rank)), torch.full((LOCAL_B,), 10.0 + rank)]
            seen, held_by, homes = [], [], []

            def step(col_offset, held):
                seen.append(col_offset // LOCAL_B)
                held_by.append(torch.stack([held[0][:, 0], held[1] - 10.0]))
                return [torch.full((held[0].shape[0], 3), 1.0 + rank)]

            full = None
            for keep in (0, 1, 2):  # entries kept from the first call's gathered block
                kept = [full[i] if i < keep else None for i in range(2)] if keep else None
                (home,), full = sw.columns(block, step, "sum", kept)
                homes.append(home)
            out[name] = dict(seen=torch.tensor(seen), held=held_by, homes=homes)
    return out


def _world1_cases(group):
    """At world size 1: contrastive_loss(distributed=...) is the single-device op, bit for bit;
    distributed_contrastive_loss itself also runs (every scheme degenerates to one block)."""
    out = {}
    img, txt = global_batch(LOCAL_B, torch.float32)
    for scheme in ("gather", "disco", "ring", "hierarchical_ring"):
        for fn_name, fn in (("api", contrastive_loss), ("direct", distributed_contrastive_loss)):
            a, t = img.clone().requires_grad_(True), txt.clone().requires_grad_(True)
            s = torch.tensor([SCALE], requires_grad=True)
            kw = dict(distributed=scheme) if fn_name == "api" else dict(scheme=scheme)
            kw["process_group"] = group
            loss = fn(a, t, s, impl="chunked_torch", label_smoothing=0.1, block_m=BLOCK_M,
                      block_n=BLOCK_N, **kw)
            (loss * UPSTREAM).backward()
            out[f"world1-{fn_name}-{scheme}"] = dict(loss=loss.detach(), img_grad=a.grad,
                                                     txt_grad=t.grad, scale_grad=s.grad)
    return out


def _compiled_cases(rank, world, group):
    """torch.compile(fullgraph=True) of the functional API with ``distributed`` set (so a graph
    break at the op is an error), against the same call in eager mode."""
    out = {}
    img_all, txt_all = global_batch(world * LOCAL_B, torch.float32)
    rows = slice(rank * LOCAL_B, (rank + 1) * LOCAL_B)
    variants = [(scheme, local, "clip_ls") for scheme, local in scheme_variants(world)]
    variants += [("gather", None, "siglip"), ("ring", None, "siglip")]
    for scheme, local, lname in variants:
        loss_name, eps = LOSSES[lname]

        def fn(i, t, s, b):
            return contrastive_loss(i, t, s, b, loss=loss_name, impl="chunked_torch",
                                    label_smoothing=eps, block_m=BLOCK_M, block_n=BLOCK_N,
                                    distributed=scheme, process_group=group,
                                    local_world_size=local)

        torch._dynamo.reset()
        res = {}
        for mode, f in (("eager", fn), ("compiled", torch.compile(fn, fullgraph=True,
                                                                  backend="aot_eager"))):
            img = img_all[rows].clone().requires_grad_(True)
            txt = txt_all[rows].clone().requires_grad_(True)
            scale = torch.tensor([SCALE], requires_grad=True)
            bias = torch.tensor([BIAS], requires_grad=True) if loss_name == "siglip" else None
            loss = f(img, txt, scale, bias)
            (loss * UPSTREAM).backward()
            res[mode] = dict(loss=loss.detach(), img_grad=img.grad, txt_grad=txt.grad,
                             scale_grad=scale.grad)
            if bias is not None:
                res[mode]["bias_grad"] = bias.grad
        out[f"{scheme}-L{local}-{lname}"] = res
    torch._dynamo.reset()
    return out


def _opcheck_cases(group):
    """torch.library.opcheck of infclip::contrastive_loss with each scheme on a 1-rank gloo group
    (schema, fake kernel, autograd registration, AOT dispatch with dynamic shapes)."""
    out = {}
    img, txt = global_batch(LOCAL_B, torch.float32)
    for scheme, loss, eps in (("gather", "clip", 0.1), ("gather", "siglip", 0.0),
                              ("disco", "clip", 0.0), ("ring", "siglip", 0.0),
                              ("hierarchical_ring", "clip", 0.1)):
        bias = torch.tensor([BIAS], requires_grad=True) if loss == "siglip" else None
        args = (img.clone().requires_grad_(True), txt.clone().requires_grad_(True),
                torch.tensor([SCALE], requires_grad=True), bias, loss, "chunked_torch", eps, BLOCK_M,
                BLOCK_N, False, 0.0, False, scheme, group.group_name, 0, "mean")
        torch.library.opcheck(torch.ops.infclip.contrastive_loss.default, args)
        out[f"{scheme}-{loss}"] = "ok"
    return out


def _run_world(rank: int, n: int, group, extra, results: dict) -> None:
    """Fills ``results``; the first exception is recorded and ends the run (the other ranks
    then fail in their next collective at the group timeout, and stop too)."""
    jobs = [(name, lambda spec=spec: _run_case(spec, rank, n, group, extra))
            for name, spec in cases(n).items()]
    jobs.append(("errors", lambda: _error_cases(rank, n, group) if n > 1 else {}))
    jobs.append(("schedules", lambda: _schedules(n, group)))
    if n == 1:
        jobs.append(("world1", lambda: _world1_cases(group)))
        jobs.append(("opcheck", lambda: _opcheck_cases(group)))
    if n == 2:
        jobs.append(("compiled", lambda: _compiled_cases(rank, n, group)))
    for name, job in jobs:
        try:
            results[name] = job()
        except Exception:
            results[name] = dict(error=traceback.format_exc())
            raise


def run(rank: int, outdir: str) -> None:
    """torch.multiprocessing.spawn target: rank ``rank`` of a gloo world of WORLD processes."""
    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"file://{os.path.join(outdir, 'store')}",
                            rank=rank, world_size=WORLD,
                            timeout=datetime.timedelta(seconds=60))
    results = {}
    try:
        # every rank creates every group, in the same order (new_group is collective on the world)
        firsts = {n: dist.new_group(list(range(n))) for n in range(1, WORLD)}
        extra = dict(interleaved=[dist.new_group(m) for m in interleaved_groups(WORLD)],
                     copy=dist.new_group(list(range(WORLD))))
        for n in range(1, WORLD + 1):
            if rank < n:
                results[n] = {}
                _run_world(rank, n, firsts.get(n), extra, results[n])
            dist.barrier()
    except Exception:  # recorded in results; the parent reports it
        pass
    finally:
        torch.save(results, os.path.join(outdir, f"rank{rank}.pt"))
        dist.destroy_process_group()
