"""Two-GPU worker of tests/ops/test_distributed_nccl.py (torch.distributed.run, NCCL).

Each rank makes the same global batch, runs every scheme on its rows and compares the loss and
its rows' gradients with one device on the whole batch; then checks that a call makes no
host-device wait, and that an uneven local batch is one clear error on both ranks after which
the group still works. Exits non-zero with the failures printed."""

from __future__ import annotations

import os
import sys

import torch
import torch.distributed as dist
import torch.nn.functional as F

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))
from infclip.ops import contrastive_loss  # noqa: E402

B, D = 384, 64
SCHEMES = ("ring", "disco", "gather", "hierarchical_ring")


def batch(device, n=B, dim=D):
    gen = torch.Generator(device="cpu").manual_seed(n)
    img = F.normalize(torch.randn(n, dim, generator=gen), dim=-1)
    txt = F.normalize(img + torch.randn(n, dim, generator=gen), dim=-1)
    return img.to(device), txt.to(device)


def leaves(img, txt):
    scale = torch.full((1,), 14.0, device=img.device)
    return [x.clone().requires_grad_(True) for x in (img, txt, scale)]


def loss_and_grads(img, txt, scale, **kw):
    loss = contrastive_loss(img, txt, scale, impl="triton", **kw)
    loss.backward()
    return loss.detach(), img.grad, txt.grad


def strips_cases(rank: int, world: int, device) -> list:
    """bf16 at b = 12,288 rows a rank (b x b >= the strips' size): the CLIP forward of disco,
    ring and hierarchical ring takes the plain sums (on an H100 / H200: the Gluon or Triton
    strips) and every gradient block sums its share of d scale; the loss, the rows' gradients
    and the logit scale's gradient (mean over ranks, as DeepSpeed reduces it) against one
    device on the whole batch."""
    from infclip.ops import contrastive_loss_triton as tri

    b = 12288
    if world == 1:
        return []  # (one rank: the single-device op, no sweep)
    if not tri.sums_in_strips(*(torch.empty(b, 256, device=device, dtype=torch.bfloat16),) * 2, ""):
        return []  # (no TMA here: the per-tile statistics with their weighted sums)
    img, txt = (x.to(torch.bfloat16) for x in batch(device, world * b, dim=256))
    rows = slice(rank * b, (rank + 1) * b)

    def run(x, t, **kw):
        x, t, scale = leaves(x, t)
        loss = contrastive_loss(x, t, scale, impl="triton", **kw)
        loss.backward()
        return loss.detach(), x.grad.float(), t.grad.float(), scale.grad

    want = run(img, txt, distributed="none")
    real, summed = tri.clip_grads_triton, []
    tri.clip_grads_triton = lambda *a, **k: (summed.append(bool(k.get("dscale_summed"))), real(*a, **k))[1]
    out = []
    try:
        for scheme in ("disco", "ring", "hierarchical_ring"):
            summed.clear()
            loss, g_img, g_txt, g_scale = run(img[rows], txt[rows], distributed=scheme)
            dist.all_reduce(g_scale)
            checks = (("loss", loss, want[0], 1e-5), ("img grad", g_img / world, want[1][rows], 1e-2),
                      ("txt grad", g_txt / world, want[2][rows], 1e-2),
                      ("scale grad", g_scale / world, want[3], 1e-3))
            for name, got, ref, tol in checks:
                err = float((got - ref).abs().max() / ref.abs().max())
                if not err <= tol:
                    out.append(f"rank {rank} strips {scheme}: {name} differs by {err:.3g} (relative)")
            if not (summed and all(summed)):
                out.append(f"rank {rank} strips {scheme}: d scale not summed by every block {summed}")
    finally:
        tri.clip_grads_triton = real
    return out


def main() -> int:
    dist.init_process_group("nccl")
    rank, world = dist.get_rank(), dist.get_world_size()
    device = torch.device("cuda", int(os.environ["LOCAL_RANK"]))
    torch.cuda.set_device(device)
    failures = []
    img, txt = batch(device)
    rows = slice(rank * B // world, (rank + 1) * B // world)
    want_loss, want_img, want_txt = loss_and_grads(*leaves(img, txt), distributed="none")
    for scheme in SCHEMES:
        loss, g_img, g_txt = loss_and_grads(*leaves(img[rows], txt[rows]), distributed=scheme)
        # the op's convention: a rank's feature gradient is world x the whole-batch one of its rows
        for name, got, want, tol in (("loss", loss, want_loss, 1e-5),
                                     ("img grad", g_img / world, want_img[rows], 1e-4),
                                     ("txt grad", g_txt / world, want_txt[rows], 1e-4)):
            err = float((got - want).abs().max() / want.abs().max())
            if not err <= tol:
                failures.append(f"rank {rank} {scheme}: {name} differs by {err:.3g} (relative)")
        inputs = leaves(img[rows], txt[rows])
        torch.cuda.synchronize()
        torch.cuda.set_sync_debug_mode("error")  # any host-device wait raises
        try:
            loss_and_grads(*inputs, distributed=scheme)
        except RuntimeError as exc:
            failures.append(f"rank {rank} {scheme}: a call waited on the GPU: {str(exc)[:200]}")
        finally:
            torch.cuda.set_sync_debug_mode("default")
    n = B // world
    uneven = slice(0, n + (1 if rank == world - 1 else 0))  # the last rank holds one row more
    for scheme in ("ring", "disco"):
        try:
            loss_and_grads(*leaves(img[uneven], txt[uneven]), distributed=scheme)
            failures.append(f"rank {rank} {scheme}: an uneven local batch was accepted")
        except ValueError as exc:
            msg = str(exc)
            if not ("same local batch" in msg and f"rank 0: {n} x {D}" in msg
                    and f"rank {world - 1}: {n + 1} x {D}" in msg):
                failures.append(f"rank {rank} {scheme}: unclear message: {msg}")
        loss, _, _ = loss_and_grads(*leaves(img[rows], txt[rows]), distributed=scheme)  # still works
        if not float((loss - want_loss).abs() / want_loss.abs()) <= 1e-5:
            failures.append(f"rank {rank} {scheme}: wrong loss after the uneven call")
    failures += strips_cases(rank, world, device)
    for line in failures:
        print(line, flush=True)
    print(f"rank {rank}: {len(failures)} failures", flush=True)
    dist.destroy_process_group()
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
