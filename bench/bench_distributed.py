"""Distributed contrastive loss: time, memory and scaling per scheme (run under torchrun).

    torchrun --nproc_per_node 2 bench/bench_distributed.py            # GPUs: NCCL, impl triton
    torchrun --nproc_per_node 2 bench/bench_distributed.py --smoke    # CPU: gloo, tiny batches

For each global batch B the script first times the single-device op on the whole batch (every
rank at once, each on its own GPU: no communication, no idle ranks; rank 0's time is t1), then
for each scheme: forward + backward of the loss on the local batch b = B / N (median of --reps
after --warmup, the slowest rank's median), peak memory per GPU, and the same scheme's
communication alone (the library's own sweeps / collectives on tensors of the same sizes, with
the compute replaced by zeros). Scaling efficiency = t1 / (N * tN). Each scheme runs on its
rank's rows of the whole batch, and one untimed call is compared with the single-device result
(loss_rel_err, grad_rel_err for the feature gradients, scale_grad_rel_err): the check of the
schemes over NCCL. Rows are appended to
--out as JSON lines; rank 0 prints a table. Larger batches are skipped (and logged as such)
when the projected time would overrun --budget-s.
On 2 GPUs of one node hierarchical_ring equals ring unless --local-world-size 1 (two one-GPU
"nodes": the inter-node code path).
"""

from __future__ import annotations

import argparse
import datetime
import gc
import importlib
import json
import os
import statistics
import sys
import tempfile
import time
import weakref

import torch
import torch.distributed as dist

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from infclip.ops import contrastive_loss  # noqa: E402
from infclip.ops.sweeps import SCHEMES, make_sweep  # noqa: E402
from infclip.ops.tuning import TUNING  # noqa: E402
from infclip.pipeline.train.step import OpTimer  # noqa: E402  (CUDA events on a GPU, the wall clock on CPU)
from gpu_queue import queue_gpu_work  # noqa: E402  (bench/, on sys.path as the script's folder)

GPU_BATCHES = (32768, 65536, 131072, 262144, 524288)
# bench-only names: (the scheme, TUNING.disco_pipelined while it runs); every other name runs
# with the module's own setting
VARIANT_SCHEMES = {"disco_one_step": ("disco", False)}
DEFAULT_PIPELINED = TUNING.disco_pipelined
SMOKE_BATCHES = (64, 192)


def features(n: int, dim: int, dtype, device, seed: int):
    """L2-normalised (img, txt) [n, dim] made on ``device``, text correlated with image."""
    gen = torch.Generator(device=device).manual_seed(seed)
    img = torch.nn.functional.normalize(torch.randn(n, dim, generator=gen, device=device), dim=-1)
    txt = torch.nn.functional.normalize(img + torch.randn(n, dim, generator=gen, device=device), dim=-1)
    return (img.to(device=device, dtype=dtype).requires_grad_(True),
            txt.to(device=device, dtype=dtype).requires_grad_(True))


def step_fn(img, txt, scale, **kw):
    def run():
        loss = contrastive_loss(img, txt, scale, check_finite=False, **kw)
        loss.backward()
        img.grad = txt.grad = scale.grad = None
        if kw.get("logit_bias") is not None:
            kw["logit_bias"].grad = None
    return run


def grads_of(img, txt, scale, **kw) -> dict:
    """Loss and gradients of one untimed call, on the CPU in fp64 (features' grads per row)."""
    loss = contrastive_loss(img, txt, scale, check_finite=False, **kw)
    loss.backward()
    out = {"loss": loss.detach().double().cpu(), "img": img.grad.double().cpu(), "txt": txt.grad.double().cpu(),
           "scale": scale.grad.double().cpu()}
    img.grad = txt.grad = scale.grad = None
    return out


def check(ours: dict, ref: dict, world: int, device) -> dict:
    """This scheme against one device on the whole batch: |loss diff| / |loss|, and for the
    feature and scale gradients max |diff| / max |ref|. The op's gradient convention: each rank's
    feature gradient is world x the whole-batch gradient of its rows (DeepSpeed then averages),
    the scale gradient's average over ranks is the whole-batch one. Worst over ranks."""
    feat = max(float((ours[k] / world - ref[k]).abs().max() / ref[k].abs().max().clamp_min(1e-30))
               for k in ("img", "txt"))
    scale_mean = ours["scale"].clone().to(device)
    dist.all_reduce(scale_mean)
    scale_err = float((scale_mean.cpu() / world - ref["scale"]).abs().max() / ref["scale"].abs().max())
    loss_err = float((ours["loss"] - ref["loss"]).abs() / ref["loss"].abs())
    return {"loss_rel_err": max(all_values(loss_err, device)), "grad_rel_err": max(all_values(feat, device)),
            "scale_grad_rel_err": scale_err}


def comm_fn(sweep, b: int, dim: int, dtype, device, loss: str = "clip"):
    """The scheme's communication alone, at the sizes of a real step (compute replaced by
    zeros): the size check, the forward and backward sweeps / collectives and the loss
    all-reduce, through the same :class:`ops.sweeps.Sweep` the op uses. SigLIP with a backward
    to follow takes one sweep: the text features round, [., D] gradient partials home (gather,
    which gathers rows: CLIP's collectives, an upper bound)."""
    f32 = dict(device=device, dtype=torch.float32)
    feats = torch.zeros(b, dim, device=device, dtype=dtype)
    vec = torch.zeros(b, **f32)

    def run():
        sweep.all_gather(torch.zeros(2, dtype=torch.int64, device=device))
        if loss == "siglip" and not sweep.gathers_rows:
            sweep.columns([feats], lambda off, held: [torch.zeros(held[0].shape[0], dim, **f32)], "sum")
            sweep.sum(torch.zeros(1, **f32))
            return
        if sweep.gathers_rows:  # gather: I and T gathered, the partials of both reduce-scattered
            n = sweep.world * b
            sweep.all_gather(feats)
            sweep.all_gather(feats)
            sweep.sum(torch.zeros(2, device=device, dtype=torch.float64))
            sweep.reduce_scatter(torch.zeros(n, dim, **f32))
            sweep.reduce_scatter(torch.zeros(n, dim, **f32))
            return
        # forward: column blocks with a per-column vector, [., 2] statistics partials home
        _, kept = sweep.columns([feats, vec], lambda off, held: [torch.zeros(held[0].shape[0], 2, **f32)])
        sweep.sum(torch.zeros(2, device=device, dtype=torch.float64))
        # backward: the blocks with the final LSEs (a gathering sweep reuses its gathered
        # features), [., D] gradient partials home
        sweep.columns([feats, vec], lambda off, held: [torch.zeros(held[0].shape[0], dim, **f32)],
                      "sum", [kept[0], None] if kept is not None else None)
    return run


def measure(fn, device: torch.device, warmup: int, reps: int, group, queued_ms: float = 0.0) -> list:
    """Times of ``reps`` calls of ``fn`` (after ``warmup``), each after a barrier of ``group``.
    ``queued_ms``: that much GPU work (a sleep kernel) is queued before each call and the timer
    starts behind it, as in training, where the loss follows the towers' forward: host work the
    GPU would wait for on an empty queue is then hidden, unless the call waits on the GPU."""
    for _ in range(warmup):
        fn()
    times = []
    for _ in range(reps):
        if group is not None:
            dist.barrier(group=group)
        queue_gpu_work(queued_ms, device)
        timer = OpTimer(device)
        fn()
        times.append(float(timer.stop()))
    return times


def slowest(value: float, device) -> float:
    t = torch.tensor([value], device=device, dtype=torch.float64)
    dist.all_reduce(t, op=dist.ReduceOp.MAX)
    return float(t.item())


def all_values(value: float, device) -> list:
    t = torch.tensor([value], device=device, dtype=torch.float64)
    out = [torch.zeros_like(t) for _ in range(dist.get_world_size())]
    dist.all_gather(out, t)
    return [float(x.item()) for x in out]


def agree(flag: bool, device) -> bool:
    """Rank 0's decision, on every rank."""
    t = torch.tensor([int(flag)], device=device)
    dist.broadcast(t, 0)
    return bool(t.item())


def peak_run(fn, device) -> tuple:
    """(peak GiB, peak above what was allocated before) of one call."""
    if device.type != "cuda":
        fn()
        return None, None
    torch.cuda.synchronize()
    before = torch.cuda.memory_allocated()
    torch.cuda.reset_peak_memory_stats()
    fn()
    torch.cuda.synchronize()
    peak = torch.cuda.max_memory_allocated()
    return peak / 2**30, (peak - before) / 2**30


def main(argv=None) -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--smoke", action="store_true", help="CPU/gloo, tiny batches, chunked_torch")
    p.add_argument("--schemes", nargs="+", default=list(SCHEMES), choices=SCHEMES + tuple(VARIANT_SCHEMES),
                   help="disco_one_step: disco's first schedule (one step on all B columns between "
                        "a blocking all-gather and reduce-scatter)")
    p.add_argument("--batches", nargs="+", type=int, default=None, help="global batch sizes")
    p.add_argument("--dim", type=int, default=None)
    p.add_argument("--dtype", default="bf16", choices=("bf16", "fp32"))
    p.add_argument("--loss", default="clip", choices=("clip", "siglip"),
                   help="siglip: bias -10, its gradient too (one sweep a call: gradients in the forward)")
    p.add_argument("--impl", default=None, help="default: triton on CUDA, chunked_torch on CPU")
    p.add_argument("--local-world-size", type=int, default=None, help="hierarchical_ring node size")
    p.add_argument("--warmup", type=int, default=1)
    p.add_argument("--queued-ms", type=float, default=0.0,
                   help="GPU work queued before each timed call (the towers' forward in training; "
                        "the timer starts behind it); 0: each call starts on an idle GPU")
    p.add_argument("--reps", type=int, default=5)
    p.add_argument("--budget-s", type=float, default=270.0, help="skip batches projected past this")
    p.add_argument("--profile", type=int, default=0, metavar="N",
                   help="also profile N calls of each scheme at each batch (rank 0 prints torch.profiler tables)")
    p.add_argument("--out", default=None, help="JSONL to append (default bench/results/distributed.jsonl;"
                   " --smoke: a temp file)")
    args = p.parse_args(argv)

    cuda = torch.cuda.is_available() and not args.smoke
    if cuda:
        torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", 0)))
    # torch.distributed.nn.functional binds group.WORLD as a default argument when imported;
    # torch.profiler imports it (through torch._dynamo) at the first --profile. Imported after
    # init, it holds the world group past destroy_process_group, which then cannot join the
    # group's threads: a gloo group dies in interpreter finalization and can abort the process
    # there ("terminate called without an active exception"). Imported first, it binds None.
    importlib.import_module("torch.distributed.nn.functional")
    dist.init_process_group("nccl" if cuda else "gloo")
    world = weakref.ref(dist.group.WORLD)
    try:
        run(args, cuda)
        dist.barrier()  # every rank past its last collective before any rank tears down
    finally:
        dist.destroy_process_group()  # joins the group's threads, unless something still holds it
    check_released(world)


def check_released(world) -> None:
    """Say so if the world group outlived destroy_process_group (the exit hazard above, which
    aborts only now and then): the test fails on this line instead of on a rare abort."""
    gc.collect()  # a reference cycle that held it (e.g. a traceback) is no leak
    if world() is not None:
        print("bench_distributed: the world process group outlived destroy_process_group; its threads "
              "are joined at interpreter exit, where a gloo group can abort", file=sys.stderr, flush=True)


def run(args, cuda: bool) -> None:
    t_start = time.monotonic()
    device = torch.device("cuda", torch.cuda.current_device()) if cuda else torch.device("cpu")
    rank, world = dist.get_rank(), dist.get_world_size()
    dtype = torch.bfloat16 if args.dtype == "bf16" else torch.float32
    dim = args.dim or (32 if args.smoke else 768)
    impl = args.impl or ("triton" if cuda else "chunked_torch")
    batches = args.batches or (SMOKE_BATCHES if args.smoke else GPU_BATCHES)
    out = args.out or (os.path.join(tempfile.mkdtemp(), "distributed_smoke.jsonl") if args.smoke
                       else "bench/results/distributed.jsonl")
    meta = dict(bench="distributed", time=datetime.datetime.now(datetime.timezone.utc).isoformat(),
                device=torch.cuda.get_device_name() if cuda else "cpu", world_size=world,
                backend=dist.get_backend(), torch=torch.__version__, dim=dim, dtype=args.dtype,
                impl=impl, warmup=args.warmup, reps=args.reps, queued_ms=args.queued_ms, loss=args.loss)
    try:
        import triton

        meta["triton"] = triton.__version__
    except ImportError:
        meta["triton"] = None
    rows = []
    projected: dict = {}  # name -> ms of one call at the previous batch

    def over_budget(name: str, batch: int, prev_batch) -> bool:
        if name not in projected or prev_batch is None:
            return False
        est = projected[name] * (batch / prev_batch) ** 2 * (args.warmup + args.reps + 1) / 1e3
        return time.monotonic() - t_start + est > args.budget_s

    def loss_kw() -> dict:
        """The loss's own arguments (SigLIP: its learnable bias, a fresh leaf per call site)."""
        if args.loss == "clip":
            return {}
        return dict(loss="siglip", logit_bias=torch.tensor([-10.0], device=device, requires_grad=True))

    prev = None
    for batch in batches:
        if batch % world:
            raise SystemExit(f"global batch {batch} is not a multiple of the world size {world}")
        b = batch // world
        # 1) the single-device op on the whole batch (every rank, its own device, no comm)
        skip = agree(rank == 0 and over_budget("single", batch, prev), device)
        t1 = None
        if skip:
            rows.append(dict(meta, scheme="single", global_batch=batch, skipped="time budget"))
        else:
            img, txt = features(batch, dim, dtype, device, seed=batch)
            scale = torch.tensor([20.0], device=device, requires_grad=True)
            ref = grads_of(img, txt, scale, impl=impl, **loss_kw())
            rows_of = slice(rank * b, (rank + 1) * b)
            ref.update(img=ref["img"][rows_of], txt=ref["txt"][rows_of])
            mine = (img.detach()[rows_of].cpu(), txt.detach()[rows_of].cpu())  # this rank's share
            fn = step_fn(img, txt, scale, impl=impl, **loss_kw())
            times = measure(fn, device, args.warmup, args.reps, None, args.queued_ms)
            peak, extra = peak_run(fn, device)
            t1 = all_values(statistics.median(times), device)[0]
            projected["single"] = t1
            rows.append(dict(meta, scheme="single", global_batch=batch, local_batch=batch,
                             fwd_bwd_ms=t1, peak_gib=peak, peak_extra_gib=extra))
            del img, txt, fn
        # 2) each scheme on the local batch
        for name in args.schemes:
            scheme, TUNING.disco_pipelined = VARIANT_SCHEMES.get(name, (name, DEFAULT_PIPELINED))
            skip = agree(rank == 0 and over_budget(name, batch, prev), device)
            if skip:
                rows.append(dict(meta, scheme=name, global_batch=batch, skipped="time budget"))
                continue
            if t1 is not None:  # this rank's rows of the whole batch: results comparable
                img, txt = (x.to(device).requires_grad_(True) for x in mine)
            else:
                img, txt = features(b, dim, dtype, device, seed=batch * world + rank)
            scale = torch.tensor([20.0], device=device, requires_grad=True)
            kw = dict(impl=impl, distributed=scheme, local_world_size=args.local_world_size, **loss_kw())
            errors = check(grads_of(img, txt, scale, **kw), ref, world, device) if t1 is not None else {}
            fn = step_fn(img, txt, scale, **kw)
            times = measure(fn, device, args.warmup, args.reps, dist.group.WORLD, args.queued_ms)
            peak, extra = peak_run(fn, device)
            sweep = make_sweep(scheme, None, args.local_world_size)
            comm = measure(comm_fn(sweep, b, dim, dtype, device, args.loss), device, 1, args.reps,
                           dist.group.WORLD)
            per_rank = all_values(statistics.median(times), device)
            t_n = max(per_rank)
            projected[name] = t_n
            comm_ms = slowest(statistics.median(comm), device)
            if args.profile:
                from profile_table import print_profile

                print_profile(lambda call=fn: [call() for _ in range(args.profile)],
                              f"{name} B={batch} b={b}", args.profile, show=rank == 0)
            rows.append(dict(meta, scheme=name, local_world_size=sweep.topo.local, global_batch=batch,
                             local_batch=b, fwd_bwd_ms=t_n, fwd_bwd_ms_per_rank=per_rank,
                             single_gpu_ms=t1,
                             scaling_efficiency=(t1 / (world * t_n)) if t1 else None,
                             comm_ms=comm_ms,
                             peak_gib=max(all_values(peak, device)) if cuda else None,
                             peak_extra_gib=max(all_values(extra, device)) if cuda else None, **errors))
            del img, txt, fn
        TUNING.disco_pipelined = DEFAULT_PIPELINED  # (again after the bench-only names)
        prev = batch
    if rank == 0:
        os.makedirs(os.path.dirname(os.path.abspath(out)), exist_ok=True)
        with open(out, "a") as f:
            for row in rows:
                f.write(json.dumps(row) + "\n")
        print(table(rows))
        print(f"\nappended {len(rows)} rows to {out} ({time.monotonic() - t_start:.0f} s)")


def table(rows) -> str:
    head = (f"{'scheme':18} {'B':>8} {'b':>8} {'fwd+bwd ms':>11} {'1-GPU ms':>9} {'eff':>6} "
            f"{'comm ms':>9} {'peak GiB':>9} {'extra GiB':>9} {'loss err':>9} {'grad err':>9}")
    lines = [head, "-" * len(head)]

    def f(x, spec):
        return format(x, spec) if isinstance(x, (int, float)) else "-"

    for r in rows:
        if r.get("skipped"):
            lines.append(f"{r['scheme']:18} {r['global_batch']:>8} skipped ({r['skipped']})")
            continue
        lines.append(f"{r['scheme']:18} {r['global_batch']:>8} {r['local_batch']:>8} "
                     f"{f(r['fwd_bwd_ms'], '11.1f')} {f(r.get('single_gpu_ms'), '9.1f'):>9} "
                     f"{f(r.get('scaling_efficiency'), '6.2f'):>6} {f(r.get('comm_ms'), '9.2f'):>9} "
                     f"{f(r['peak_gib'], '9.2f'):>9} {f(r['peak_extra_gib'], '9.2f'):>9} "
                     f"{f(r.get('loss_rel_err'), '9.1e'):>9} {f(r.get('grad_rel_err'), '9.1e'):>9}")
    return "\n".join(lines)


if __name__ == "__main__":
    main()
