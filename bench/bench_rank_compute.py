"""One rank's compute in a distributed scheme, emulated on one GPU (no process group).

    python bench/bench_rank_compute.py --worlds 2 4 --batches 32768 65536 131072 --loss clip siglip

Rank 0 of an N-rank group runs the loss assembly (ops/assembly.py) through an emulated sweep:
the same steps, on the same shapes, in the same order as bench_distributed.py's schemes, with
the other ranks' column blocks made up front, collectives replaced by local work (all-gather:
N copies of this rank's tensor; reduce-scatter: the sum of its N slices; all-reduces: nothing;
disco's reduces to each block's owner: the blocks' partials added into the own block's) and the
ring's incoming partials merged as the real ring merges them. What is left is the compute a
rank does, without its communication and its waits: ``t1 / (N tN)`` against the single-device
op on the whole batch in the same process (t1) bounds the scheme's scaling from above, and the
difference to bench_distributed.py's measured scaling is what communication and imbalance
cost. Variants of the assembly, each scheme where it differs: ``default``; ``local_blocks``
(the gradient steps' blocks sized by the column block's budget, not the global batch's,
TUNING.sweep_blocks_global); ``one_step`` (disco: one step on all B columns between a
blocking all-gather and reduce-scatter, TUNING.disco_pipelined off); ``weighted`` (CLIP: also the forward's weighted sums by the
per-tile statistics kernels instead of d scale summed in the gradient blocks,
TUNING.sweeps_sum_dscale). Times: CUDA events behind --queued-ms of
queued GPU work, median of --reps; peak: the most allocated during one call above what was
allocated before it. The rows go to --out as JSON lines; a table is printed.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import statistics
import sys

import torch

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from infclip.ops import assembly, contrastive_loss  # noqa: E402
from infclip.ops.sweeps import Gathered, HierarchicalRing, Local, Ring  # noqa: E402
from infclip.ops.tuning import TUNING  # noqa: E402
from infclip.pipeline.train.step import OpTimer  # noqa: E402
from gpu_queue import queue_gpu_work  # noqa: E402

SCHEMES = {"disco": Gathered, "ring": Ring, "hierarchical_ring": HierarchicalRing}


class _Emulated:
    """Rank 0 of ``world`` ranks; ``others``: the column blocks (text features) of ranks 1..N-1."""

    def __init__(self, world: int, others: list):
        super().__init__(None)
        self._world, self.others = world, others

    @property
    def world(self) -> int:
        return self._world

    @property
    def rank(self) -> int:
        return 0

    def _held(self, block: list, owner: int) -> list:
        # the owner's features; its per-column vectors as this rank's (same shapes, same work)
        return block if owner == 0 else [self.others[owner - 1], *block[1:]]

    def columns(self, block, fn, merge="sum", kept=None):
        b = block[0].shape[0]
        if self.gathers_columns:
            full = [g if g is not None else self.all_gather(x) if i else
                    torch.cat([x, *self.others]) for i, (x, g) in
                    enumerate(zip(block, kept or [None] * len(block)))]
            if not TUNING.disco_pipelined:
                return [self.reduce_scatter(p, merge) for p in fn(0, full)], full
            # the own block first, then the others in rank order; each block's partials "reduced"
            # into the own ones (the sum a real owner receives, mixed as the ring's merges mix)
            parts = fn(0, list(block))
            for q in range(1, self._world):
                step = fn(q * b, [x[q * b:(q + 1) * b] for x in full])
                parts = [p.add_(s) for p, s in zip(parts, step)]
            return parts, full
        parts = None
        for t in range(self._world):  # rank 0 holds the block of rank (0 - t) mod N at step t
            owner = (-t) % self._world
            step = fn(owner * b, self._held(block, owner))
            parts = step if parts is None else [p.add_(q) for p, q in zip(step, parts)]
        return parts, None

    def all_gather(self, x, out=None):
        full = torch.cat([x] * self._world)
        return full if out is None else out.copy_(full)

    def reduce_scatter(self, x, merge="sum"):
        # the N slices summed, as if each rank's contribution to rank 0's were rank 0's own slice
        # of every owner (so the partials mix as the ring's merges mix them)
        return x.view(self._world, -1, *x.shape[1:]).sum(0)

    # the all-reduces and the size check: nothing to combine (as on one device)
    max_, sum, check_sizes = Local.max_, Local.sum, Local.check_sizes


def emulated(scheme: str, world: int, others: list):
    cls = SCHEMES[scheme]
    return type(f"Emulated{cls.__name__}", (_Emulated, cls), {})(world, others)


def features(n: int, dim: int, device, seed: int):
    gen = torch.Generator(device=device).manual_seed(seed)
    img = torch.nn.functional.normalize(torch.randn(n, dim, generator=gen, device=device), dim=-1)
    txt = torch.nn.functional.normalize(img + torch.randn(n, dim, generator=gen, device=device), dim=-1)
    return img.bfloat16(), txt.bfloat16()


def rank_step(loss: str, img, txt, s, bias, sw, o):
    """Forward + backward of rank 0 through the assembly, as the registered op runs them."""
    g = torch.ones((), device=img.device)
    if loss == "clip":
        _, row_lse, col_lse, aux, kept = assembly.clip_forward(img, txt, s, sw, o)
        return assembly.clip_backward(g, img, txt, s, row_lse, col_lse, aux, kept, sw, o)
    _, d_img, d_txt, sums = assembly.siglip_forward_with_grads(img, txt, s, bias, sw, o)
    return assembly.siglip_backward_from_forward(g, s, img.dtype, d_img, d_txt, sums, sw, o)


# variant -> (TUNING.sweeps_sum_dscale, TUNING.sweep_blocks_global, TUNING.disco_pipelined)
VARIANTS = {"default": (True, True, True), "local_blocks": (True, False, True),
            "weighted": (False, False, True), "one_step": (True, True, False)}


def set_variant(name: str) -> None:
    TUNING.sweeps_sum_dscale, TUNING.sweep_blocks_global, TUNING.disco_pipelined = VARIANTS[name]


def variants(loss: str, scheme: str) -> list:
    names = ["default", "local_blocks"]
    if scheme == "disco":  # (the first version's one step on all B columns)
        names.append("one_step")
    if loss == "clip":
        names.append("weighted")
    return names


def peak_mib(fn) -> float:
    torch.cuda.synchronize()
    before = torch.cuda.memory_allocated()
    torch.cuda.reset_peak_memory_stats()
    fn()
    torch.cuda.synchronize()
    return (torch.cuda.max_memory_allocated() - before) / 2**20


def timed(fn, device, reps: int, queued_ms: float) -> float:
    fn()
    times = []
    for _ in range(reps):
        queue_gpu_work(queued_ms, device)
        timer = OpTimer(device)
        fn()
        times.append(float(timer.stop()))
    return statistics.median(times)


def main(argv=None) -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--worlds", nargs="+", type=int, default=[2, 4])
    p.add_argument("--batches", nargs="+", type=int, default=[32768, 65536, 131072])
    p.add_argument("--loss", nargs="+", default=["clip", "siglip"], choices=("clip", "siglip"))
    p.add_argument("--schemes", nargs="+", default=list(SCHEMES), choices=list(SCHEMES))
    p.add_argument("--variants", nargs="+", default=list(VARIANTS), choices=list(VARIANTS),
                   help="of those that apply to each scheme and loss (default: all)")
    p.add_argument("--dim", type=int, default=768)
    p.add_argument("--reps", type=int, default=7)
    p.add_argument("--queued-ms", type=float, default=20.0)
    p.add_argument("--out", default="bench/results/rank_compute.jsonl")
    args = p.parse_args(argv)
    device = torch.device("cuda")
    meta = dict(bench="rank_compute", time=datetime.datetime.now(datetime.timezone.utc).isoformat(),
                device=torch.cuda.get_device_name(), torch=torch.__version__, dim=args.dim,
                reps=args.reps, queued_ms=args.queued_ms)
    rows = []
    s = torch.tensor(20.0, device=device)
    for loss in args.loss:
        bias = torch.tensor(-10.0, device=device) if loss == "siglip" else None
        for batch in args.batches:
            img, txt = features(batch, args.dim, device, batch)
            leaves = [x.clone().requires_grad_(True) for x in (img, txt)]
            scale = torch.tensor([20.0], device=device, requires_grad=True)
            kw = dict(loss="siglip", logit_bias=torch.tensor([-10.0], device=device)) if bias is not None else {}

            def single():
                contrastive_loss(*leaves, scale, impl="triton", check_finite=False, **kw).backward()
                leaves[0].grad = leaves[1].grad = scale.grad = None

            t1 = timed(single, device, args.reps, args.queued_ms)
            print(f"{loss} B={batch}: one device {t1:.2f} ms, {peak_mib(single):.0f} MiB", flush=True)
            for world in args.worlds:
                b = batch // world
                others = [txt[r * b:(r + 1) * b] for r in range(1, world)]
                o = assembly.Options(loss, "triton", 0.0, False, 0, 0, float(world))
                for scheme in args.schemes:
                    for variant in [v for v in variants(loss, scheme) if v in args.variants]:
                        set_variant(variant)
                        sw = emulated(scheme, world, others)

                        def call():
                            rank_step(loss, img[:b], txt[:b], s, bias, sw, o)

                        t_n = timed(call, device, args.reps, args.queued_ms)
                        peak = peak_mib(call)
                        bound = t1 / (world * t_n)
                        rows.append(dict(meta, loss=loss, global_batch=batch, world=world, scheme=scheme,
                                         variant=variant, single_ms=t1, rank_ms=t_n, peak_extra_mib=peak,
                                         compute_scaling=bound))
                        print(f"  N={world} {scheme:18s} {variant:12s}: rank {t_n:7.2f} ms, {peak:6.0f} MiB, "
                              f"compute scaling {100 * bound:5.1f}%", flush=True)
                    set_variant("default")
    os.makedirs(os.path.dirname(os.path.abspath(args.out)), exist_ok=True)
    with open(args.out, "a") as f:
        for row in rows:
            f.write(json.dumps(row) + "\n")


if __name__ == "__main__":
    main()
