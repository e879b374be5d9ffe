"""The contrastive loss over a batch spread across a process group: gather, disco, ring, hierarchical ring.

Every scheme computes the loss of the GLOBAL batch (B = N * b rows for N ranks of b rows each)
from the block primitives of ops/blocks.py, whose partial results merge by addition.
Rank r owns rows I_r and columns T_r. The LSE shift of row or column i is its diagonal logit
s <I_i, T_i> (raised to the Cauchy-Schwarz bound - 64 where that is higher: clip_shifts), known to
the owner of both, so partial sums from other ranks add with no rescaling; the assembly
(clip_terms) is the single-device one.

    gather             all-gather I and T; rank r computes its rows (I_r x T_all) and its
                       columns (I_all x T_r): 2 b x B blocks; backward reduce-scatters the
                       gathered-feature gradients (OpenCLIP local loss + gather_with_grad).
    disco              all-gather T; rank r computes I_r x T_all once: its rows complete, column
                       partials reduce-scattered (O(B) floats); backward: P @ T_all gives dI_r,
                       P^T @ I_r (B x D) is reduce-scattered into dT_r (DisCo-CLIP, SUM not AVG).
    ring               T blocks travel round the ring (rank r sends to r+1); the next transfer
                       is posted before computing on the block in hand. Column partials travel
                       with their block and arrive home after N steps; the backward goes round
                       again with the final LSEs, dT partials travelling the same way. Memory
                       O(b D) per rank; each b x b block of S computed once per direction.
    hierarchical_ring  the same ring nested: nodes of L ranks pass node blocks round an
                       inter-node ring while each node block goes round the intra-node ring, so
                       one inter-node transfer per step is hidden behind a whole intra round.

Gradient convention. Every rank returns the same global loss L. The feature gradients on rank r
are c * dL/d(features_r), complete (they include the terms computed on other ranks), and the
logit_scale / logit_bias gradients are c * (rank r's share of dL/ds), the shares summing to dL/ds.
c = N for ``grad_reduction="mean"`` (DeepSpeed / DDP average gradients), c = 1 for "sum". After
the framework reduces gradients, every parameter gradient equals the one-process full-batch one.
The upstream gradient of L is taken to be the same on every rank (it is under DeepSpeed: loss
scaling and gradient-accumulation division are global); it is not all-reduced.

Design choice: one generic two-level ring (``sweep``) runs every pass of ring and
hierarchical_ring (CLIP stats, gradients; SigLIP), parametrised by a step
function on a column block; the loss assembly above it mirrors the single-device code. The
schedules and memory / traffic formulas are in docs/distributed.md.

Limits. Equal local batches on every rank (checked with one tiny all-gather per call: a clear
error otherwise). hierarchical_ring takes node = group_rank // local_world_size, i.e. consecutive
group ranks share a node (what torchrun / the deepspeed launcher do for the world group), and
creates its sub-groups on first use with a collective over the whole world. The loss is an
autograd.Function, not a registered torch.library op (a graph break under torch.compile).
"""

from __future__ import annotations

import dataclasses
import logging
import math
import os
from typing import Callable, List, Optional, Sequence

import torch
import torch.distributed as dist
from torch import Tensor

from .blocks import (
    clip_grads,
    clip_shifts,
    clip_stats,
    clip_terms,
    rownorm,
    siglip_grads,
    siglip_stats,
)

__all__ = ["SCHEMES", "distributed_contrastive_loss", "Topology", "topology", "sweep",
           "launcher_local_world_size"]

log = logging.getLogger(__name__)

SCHEMES = ("gather", "disco", "ring", "hierarchical_ring")

# torch >= 2.13 renames the tensor-in/tensor-out collectives; the GPU machine runs 2.11.
_all_gather_single = getattr(dist, "all_gather_single", None) or dist.all_gather_into_tensor
_reduce_scatter_single = getattr(dist, "reduce_scatter_single", None) or dist.reduce_scatter_tensor


# ----------------------------------------------------------------------------------------------
# Topology: ranks, nodes, and the cached sub-groups of the hierarchical ring
# ----------------------------------------------------------------------------------------------
@dataclasses.dataclass(frozen=True)
class Topology:
    """Where this rank sits. ``ranks[i]`` is the global rank of group rank i; group rank
    ``node * local + local_rank``. ``intra`` carries the ring inside a node and ``inter`` the
    ring between nodes (separate communicators, so on NCCL the two rings use separate streams
    and overlap); both are ``group`` when there is one node."""

    group: Optional[dist.ProcessGroup]
    world: int
    rank: int
    ranks: tuple
    local: int
    intra: Optional[dist.ProcessGroup]
    inter: Optional[dist.ProcessGroup]

    @property
    def nodes(self) -> int:
        return self.world // self.local

    @property
    def node(self) -> int:
        return self.rank // self.local

    @property
    def local_rank(self) -> int:
        return self.rank % self.local


_SUBGROUPS: dict = {}


def _alive(group) -> bool:
    try:
        dist.get_rank(group)
        return True
    except (ValueError, RuntimeError):  # destroyed with its parent (e.g. a re-initialised world)
        return False


def _collective_device(group) -> torch.device:
    if dist.get_backend(group) == "nccl":
        return torch.device("cuda", torch.cuda.current_device())
    return torch.device("cpu")


def _layouts(group, ranks: tuple, local: int) -> list:
    """Every (group ranks, local) pair that some rank of the world needs sub-groups for: just
    ours for the world group, else gathered from all ranks (each may belong to another group,
    e.g. one data-parallel group per model-parallel rank)."""
    if group is None or group == dist.group.WORLD:
        return [(ranks, local)]
    world = dist.get_world_size()
    mine = torch.full((world + 2,), -1, dtype=torch.int64, device=_collective_device(group))
    mine[0], mine[1] = local, len(ranks)
    mine[2:2 + len(ranks)] = torch.tensor(ranks)
    every = torch.empty(world, world + 2, dtype=torch.int64, device=mine.device)
    _all_gather_single(every, mine)
    out = {(tuple(row[2:2 + row[1]]), row[0]) for row in every.tolist()}
    return sorted(out)


def _subgroups(group, ranks: tuple, local: int):
    """(intra, inter) sub-groups of this rank for nodes of ``local`` ranks, built once per
    (group, topology) and cached.

    Plain ``new_group`` is collective over the whole world, so every rank of the world creates
    every sub-group of every layout in ``_layouts``, in the same order (the first call must
    therefore be made on all ranks of the world, as data-parallel training does).
    ``use_local_synchronization=True`` would avoid that, but its group names hash the number of
    groups each rank has seen, which differ between ranks as soon as any rank belongs to a group
    the others do not: the creation then hangs (torch 2.13).
    """
    key = (ranks, local)
    cached = _SUBGROUPS.get(key)
    if cached is not None and all(_alive(g) for g in cached):
        return cached
    backend = dist.get_backend(group)
    me = dist.get_rank()
    for lay_ranks, lay_local in _layouts(group, ranks, local):
        nodes = len(lay_ranks) // lay_local
        intras = [[lay_ranks[m * lay_local + i] for i in range(lay_local)] for m in range(nodes)]
        inters = [[lay_ranks[m * lay_local + i] for m in range(nodes)] for i in range(lay_local)]
        made = {}
        for kind, lists in (("intra", intras), ("inter", inters)):
            for members in lists:
                pg = dist.new_group(members, backend=backend)
                if me in members:
                    made[kind] = pg
        if (lay_ranks, lay_local) == key:
            _SUBGROUPS[key] = (made["intra"], made["inter"])
    log.debug("hierarchical ring: %d nodes x %d ranks; group ranks %s", len(ranks) // local, local,
              ranks)
    return _SUBGROUPS[key]


# Ranks per node as the launchers export it: torchrun, the deepspeed launcher, OpenMPI.
_LOCAL_SIZE_ENV = ("LOCAL_WORLD_SIZE", "LOCAL_SIZE", "OMPI_COMM_WORLD_LOCAL_SIZE")


def launcher_local_world_size() -> Optional[int]:
    """Processes per node from the launcher's environment (None when no launcher says)."""
    for name in _LOCAL_SIZE_ENV:
        value = os.environ.get(name)
        if value:
            return int(value)
    return None


def topology(process_group=None, scheme: str = "ring", local_world_size: Optional[int] = None
             ) -> Topology:
    """The Topology of ``process_group`` (None: the world) for ``scheme``.

    ``hierarchical_ring`` groups ranks into nodes of ``local_world_size`` (else the launcher's
    LOCAL_WORLD_SIZE / LOCAL_SIZE / OMPI_COMM_WORLD_LOCAL_SIZE, else one node holding the whole
    group). Every other scheme is one node. Its first call with a new layout creates the
    sub-groups: a collective over the whole world (every rank must make that call).
    """
    if not (dist.is_available() and dist.is_initialized()):
        raise RuntimeError("distributed contrastive loss needs an initialised torch.distributed "
                           "process group (dist.init_process_group)")
    group = process_group
    world = dist.get_world_size(group)
    rank = dist.get_rank(group)
    ranks = tuple(dist.get_process_group_ranks(group if group is not None else dist.group.WORLD))
    local = world
    if scheme == "hierarchical_ring":
        local = local_world_size or launcher_local_world_size() or world
        if local < 1:
            raise ValueError(f"local_world_size must be >= 1, got {local}")
        if local >= world:
            local = world
        elif world % local:
            raise ValueError(f"hierarchical_ring: the group has {world} ranks, not a multiple of "
                             f"local_world_size={local} (ranks per node); set "
                             "contrastive_loss.local_world_size to the GPUs per node")
    if local == world:  # one node: the whole ring is intra-node
        intra, inter = group, None
    elif local == 1:  # one rank per node: the whole ring is inter-node
        intra, inter = None, group
    else:
        intra, inter = _subgroups(group, ranks, local)
    return Topology(group, world, rank, ranks, local, intra, inter)


# ----------------------------------------------------------------------------------------------
# Sweeps: rank r's rows against every column block; column partials end at their owner
# ----------------------------------------------------------------------------------------------
# A step function ``fn(col_offset, block) -> parts`` gets a column block (a list of tensors with
# the block's rows first: features, then per-column vectors) whose first row is global column
# ``col_offset``; it accumulates rank r's row results itself and returns this block's column
# partials (a list, possibly empty). ``merge`` ("sum" or "max") combines partials of one block.
StepFn = Callable[[int, List[Tensor]], List[Tensor]]


def _merge(parts: List[Tensor], incoming: Sequence[Tensor], how: str) -> List[Tensor]:
    for p, q in zip(parts, incoming):
        if how == "sum":
            p.add_(q)
        else:
            torch.maximum(p, q, out=p)
    return parts


class _Transfer:
    """Send ``send`` to global rank ``to`` and receive tensors shaped like ``like`` from
    ``frm``, in one batch of isend/irecv; ``wait()`` returns the received tensors."""

    def __init__(self, send: Sequence[Tensor], like: Sequence[Tensor], to: int, frm: int, group):
        self.bufs = [torch.empty_like(x) for x in like]
        ops = [dist.P2POp(dist.isend, x, to, group) for x in send]
        ops += [dist.P2POp(dist.irecv, y, frm, group) for y in self.bufs]
        self._send = list(send)  # keep alive until the transfer is done
        self._works = dist.batch_isend_irecv(ops)

    def wait(self) -> List[Tensor]:
        for work in self._works:
            work.wait()
        self._send = []
        return self.bufs


def _ring_round(group, peers: Sequence[int], pos: int, block: List[Tensor], offsets: Sequence[int],
                fn: StepFn, merge: str) -> List[Tensor]:
    """One round of a ring of n = len(peers) members (global ranks, in ring order; this rank at
    ``pos``). Member j starts with the block at column offset ``offsets[j]``; at step t this rank
    holds the block of member (pos - t) mod n. Returns this rank's own block's column partials,
    merged over all n members."""
    n = len(peers)
    if n == 1:
        return fn(offsets[0], block)
    nxt, prv = peers[(pos + 1) % n], peers[(pos - 1) % n]
    acc: Optional[_Transfer] = None
    for t in range(n):
        # post the next block's transfer first; it runs while we compute on the one in hand
        move = _Transfer(block, block, nxt, prv, group) if t < n - 1 else None
        parts = fn(offsets[(pos - t) % n], block)
        if acc is not None:
            parts = _merge(parts, acc.wait(), merge)
        # this block's partials follow it to the next member (after step n-1: to its owner);
        # they are needed there only after its next compute, so the transfer is hidden too
        acc = _Transfer(parts, parts, nxt, prv, group) if parts else None
        if move is not None:
            block = move.wait()
    return acc.wait() if acc is not None else []


def sweep(topo: Topology, block: List[Tensor], fn: StepFn, merge: str = "sum") -> List[Tensor]:
    """Run ``fn`` on every column block of the group, ring style (two nested levels).

    block: this rank's column block (tensors of b rows). Node m's ranks hold, at outer step u,
    the node block of node (m - u) mod M and pass its b-row pieces round the intra-node ring;
    the next node block is in flight on the inter-node ring meanwhile. Each node's merged
    partials for a node block follow it to the next node and reach the owner after M steps.
    Returns the column partials of this rank's own block, merged over all ranks.
    """
    block = [x.contiguous() for x in block]  # p2p sends whole storage; receivers copy the layout
    b = block[0].shape[0]
    L, M = topo.local, topo.nodes
    node, lr = topo.node, topo.local_rank
    intra = [topo.ranks[node * L + i] for i in range(L)]
    inter = [topo.ranks[m * L + lr] for m in range(M)]

    def node_round(node_offset: int, held: List[Tensor]) -> List[Tensor]:
        src = node_offset // (L * b)
        return _ring_round(topo.intra, intra, lr, held, [(src * L + i) * b for i in range(L)], fn,
                           merge)

    return _ring_round(topo.inter, inter, node, block, [m * L * b for m in range(M)], node_round,
                       merge)


def _all_gather(x: Tensor, topo: Topology) -> Tensor:
    out = x.new_empty((topo.world * x.shape[0],) + tuple(x.shape[1:]))
    _all_gather_single(out, x.contiguous(), group=topo.group)
    return out


def _reduce_scatter(x: Tensor, topo: Topology, merge: str = "sum") -> Tensor:
    out = x.new_empty((x.shape[0] // topo.world,) + tuple(x.shape[1:]))
    op = dist.ReduceOp.SUM if merge == "sum" else dist.ReduceOp.MAX
    _reduce_scatter_single(out, x.contiguous(), op=op, group=topo.group)
    return out


def _gathered_sweep(topo: Topology, block: List[Tensor], fn: StepFn, merge: str = "sum",
                    gathered: Optional[List[Optional[Tensor]]] = None):
    """DisCo-style sweep: all-gather the column blocks, one call of ``fn`` on all B columns,
    reduce-scatter the column partials. ``gathered`` supplies already-gathered tensors (None
    entries are gathered now). Returns (own column partials, the gathered block)."""
    full = [g if g is not None else _all_gather(x, topo)
            for x, g in zip(block, gathered or [None] * len(block))]
    parts = fn(0, full)
    return [_reduce_scatter(p, topo, merge) for p in parts], full


# ----------------------------------------------------------------------------------------------
# Loss assembly (mirrors _clip_forward / _clip_backward / _siglip_* of ops/contrastive_loss.py)
# ----------------------------------------------------------------------------------------------
@dataclasses.dataclass(frozen=True)
class _Options:
    scheme: str
    loss: str
    impl: str
    eps: float
    allow_tf32: bool
    block_m: int
    block_n: int
    topo: Topology
    factor: float  # c of the gradient convention

    @property
    def kw(self) -> dict:
        return dict(impl=self.impl, block_m=self.block_m, block_n=self.block_n,
                    allow_tf32=self.allow_tf32)


def _check_sizes(img: Tensor, topo: Topology, scheme: str) -> None:
    mine = torch.tensor([img.shape[0], img.shape[1]], dtype=torch.int64, device=img.device)
    sizes = _all_gather(mine, topo).view(topo.world, 2).tolist()
    if any(s != sizes[0] for s in sizes):
        listing = ", ".join(f"rank {r}: {s[0]} x {s[1]}" for r, s in enumerate(sizes))
        raise ValueError(f"distributed contrastive loss ({scheme}) needs the same local batch "
                         f"[b, D] on every rank of the group; got {listing}")


def _sum_over_group(values: Tensor, topo: Topology) -> Tensor:
    out = values.double()
    dist.all_reduce(out, group=topo.group)
    return out


def _clip_stats_pass(img, txt, s, row_shift, col_params, ref, o: _Options, gathered=None):
    """Stats of rank r's rows and columns over the global batch, positives left out:
    (row_sum, col_sum, row_wsum, col_wsum) [b] each, plus whatever was gathered (disco / gather
    reuse it in backward). col_params: [b, 2] (column shift, ref) of rank r's columns."""
    topo, kw = o.topo, o.kw
    rank_offset = topo.rank * img.shape[0]
    if o.scheme == "gather":
        img_all, txt_all, params_all = gathered  # params_all [B, 3]: row shift, col shift, ref
        # own rows: I_r x T_all; own columns as the rows of S^T = s T I^T: T_r x I_all (both
        # b x B, row sums, the kernels' cheap direction); the other direction's output unused.
        # Positives at i - j == -rank_offset in both.
        rs, _, rws, _ = clip_stats(img, txt_all, s, row_shift, params_all[:, 1], ref,
                                   params_all[:, 2], -rank_offset, **kw)
        cs, _, cws, _ = clip_stats(txt, img_all, s, col_params[:, 0], params_all[:, 0], ref,
                                   params_all[:, 2], -rank_offset, **kw)
        return (rs, cs, rws, cws), gathered
    rows = [torch.zeros_like(row_shift), torch.zeros_like(row_shift)]

    def step(col_offset, held):
        cols = held[1]
        r_sum, c_sum, r_wsum, c_wsum = clip_stats(img, held[0], s, row_shift, cols[:, 0], ref,
                                                  cols[:, 1], col_offset - rank_offset, **kw)
        rows[0] += r_sum
        rows[1] += r_wsum
        return [torch.stack([c_sum, c_wsum], 1)]

    if o.scheme == "disco":
        (cols,), full = _gathered_sweep(topo, [txt, col_params], step, "sum")
        kept = full[0]
    else:
        (cols,) = sweep(topo, [txt, col_params], step, "sum")
        kept = None
    return (rows[0], cols[:, 0], rows[1], cols[:, 1]), kept


def _clip_forward(img, txt, s, o: _Options):
    topo, eps = o.topo, o.eps
    n_global = topo.world * img.shape[0]
    # the shift bounds need the largest feature norms of the whole batch (one tiny all-reduce)
    norms = torch.stack([rownorm(img).max(), rownorm(txt).max()])
    dist.all_reduce(norms, op=dist.ReduceOp.MAX, group=topo.group)
    row_shift, col_shift, ref = clip_shifts(img, txt, s, a_max=norms[0], b_max=norms[1])
    col_params = torch.stack([col_shift, ref], 1)
    gathered = None
    if o.scheme == "gather":
        gathered = (_all_gather(img, topo), _all_gather(txt, topo),
                    _all_gather(torch.stack([row_shift, col_shift, ref], 1), topo))
    stats, kept = _clip_stats_pass(img, txt, s, row_shift, col_params, ref, o, gathered)
    r_off, c_off, r_wsum, c_wsum = stats
    r_loss, row_lse, r_e = clip_terms(r_off, r_wsum, row_shift, ref, s)
    c_loss, col_lse, c_e = clip_terms(c_off, c_wsum, col_shift, ref, s)
    share = 0.5 * (r_loss.sum() + c_loss.sum()) / n_global
    pieces = [share.reshape(1)]
    if eps:
        share = share + eps * s * ref.sum() / n_global
        pieces = [share.reshape(1), img.sum(0, dtype=torch.float32), txt.sum(0, dtype=torch.float32)]
    total = _sum_over_group(torch.cat([p.double() for p in pieces]), topo)
    loss = total[0].float()
    img_sum = txt_sum = None
    if eps:
        d = img.shape[1]
        img_sum, txt_sum = total[1:1 + d].float(), total[1 + d:].float()
        loss = loss - eps / n_global**2 * s * torch.dot(img_sum, txt_sum)
    saved = dict(row_lse=row_lse, col_lse=col_lse, expect=r_e.sum() + c_e.sum(), ref=ref,
                 ref_sum=ref.sum(), img_sum=img_sum, txt_sum=txt_sum,
                 gathered=gathered if o.scheme == "gather" else kept)
    return loss, saved


def _clip_backward(g, img, txt, s, saved, o: _Options):
    topo, eps, kw = o.topo, o.eps, o.kw
    b = img.shape[0]
    n_global = topo.world * b
    row_lse, col_lse = saved["row_lse"], saved["col_lse"]
    if o.scheme == "gather":
        img_all, txt_all, _ = saved["gathered"]
        none = torch.full((n_global,), math.inf, device=img.device)
        # exp(S - inf) = 0: only the row-softmax term for I_r x T_all, and for T_r x I_all (the
        # rows of S^T) only the column-softmax term
        # label terms of one direction each, taken inside the tiles (see clip_grads)
        lab = dict(diag=-topo.rank * b, diag_value=1 - eps, offset=eps / n_global)
        d_img, d_txt_all = clip_grads(img, txt_all, s, row_lse, none, saved["ref"], **lab, **kw)
        d_txt, d_img_all = clip_grads(txt, img_all, s, col_lse, none, saved["ref"], **lab, **kw)
        d_img += _reduce_scatter(d_img_all, topo)
        del d_img_all
        d_txt += _reduce_scatter(d_txt_all, topo)
    else:
        rows = [torch.zeros(img.shape, dtype=torch.float32, device=img.device)]

        def step(col_offset, held):
            # positives (global row == global column) at i - j == col_offset - row_offset; the
            # label terms are taken inside the tiles, before rounding (see clip_grads)
            grad_a, grad_b = clip_grads(img, held[0], s, row_lse, held[1], saved["ref"],
                                        diag=col_offset - topo.rank * b, diag_value=2 * (1 - eps),
                                        offset=2 * eps / n_global, **kw)
            rows[0] += grad_a
            return [grad_b]

        if o.scheme == "disco":
            (d_txt,), _ = _gathered_sweep(topo, [txt, col_lse], step, "sum", [saved["gathered"], None])
        else:
            (d_txt,) = sweep(topo, [txt, col_lse], step, "sum")
        d_img = rows[0]
    coef = g / (2 * n_global)
    # this rank's share: sum over its rows and columns of E[S'] - S'_ii (see clip_terms)
    d_scale = coef * saved["expect"]
    if eps:
        img_sum, txt_sum = saved["img_sum"], saved["txt_sum"]
        # the global term -2 eps / B <sum I, sum T>: each rank takes 1/N of it
        d_scale = d_scale + coef * 2 * eps * (
            saved["ref_sum"] - torch.dot(img_sum, txt_sum) / n_global / topo.world)
    d_img.mul_(coef * s * o.factor)
    d_txt.mul_(coef * s * o.factor)
    return d_img, d_txt, d_scale * o.factor


def _siglip_forward(img, txt, s, bias, o: _Options):
    topo, kw = o.topo, o.kw
    b = img.shape[0]
    row_offset = topo.rank * b
    row_loss = torch.zeros(b, dtype=torch.float32, device=img.device)

    def step(col_offset, held):
        # the positives (global row == global column) sit at i - j == col_offset - row_offset
        row_loss.add_(siglip_stats(img, held[0], s, bias, col_offset - row_offset, **kw))
        return []

    kept = None
    if o.scheme in ("gather", "disco"):
        _, (kept,) = _gathered_sweep(topo, [txt], step)
    else:
        sweep(topo, [txt], step)
    total = _sum_over_group((row_loss.sum() / (topo.world * b)).reshape(1), topo)
    return total[0].float(), dict(gathered=kept)


def _siglip_backward(g, img, txt, s, bias, saved, o: _Options):
    topo, kw = o.topo, o.kw
    b = img.shape[0]
    row_offset = topo.rank * b
    rows = [torch.zeros(img.shape, dtype=torch.float32, device=img.device),
            img.new_zeros((), dtype=torch.float32), img.new_zeros((), dtype=torch.float32)]

    def step(col_offset, held):
        grad_a, grad_b, gsum, gwsum = siglip_grads(img, held[0], s, bias, col_offset - row_offset, **kw)
        rows[0] += grad_a
        rows[1] += gsum
        rows[2] += gwsum
        return [grad_b]

    if o.scheme in ("gather", "disco"):
        (d_txt,), _ = _gathered_sweep(topo, [txt], step, "sum", [saved["gathered"]])
    else:
        (d_txt,) = sweep(topo, [txt], step)
    coef = g / (topo.world * b) * o.factor
    return rows[0].mul_(coef * s), d_txt.mul_(coef * s), coef * rows[2], coef * rows[1]


class _DistributedContrastiveLoss(torch.autograd.Function):
    """Forward: the global loss (same value on every rank). Backward: this rank's feature
    gradients and its share of the logit_scale / logit_bias gradients, times the factor c."""

    @staticmethod
    def forward(ctx, img: Tensor, txt: Tensor, logit_scale: Tensor, logit_bias: Optional[Tensor],
                o: _Options) -> Tensor:
        s = logit_scale.detach().float().reshape(())
        bias = None
        if o.loss == "clip":
            loss, saved = _clip_forward(img, txt, s, o)
        else:
            bias = logit_bias.detach().float().reshape(())
            loss, saved = _siglip_forward(img, txt, s, bias, o)
        ctx.o, ctx.s, ctx.bias, ctx.saved = o, s, bias, saved
        ctx.has_bias = logit_bias is not None
        ctx.save_for_backward(img, txt, logit_scale, logit_bias)
        return loss

    @staticmethod
    def backward(ctx, grad_loss: Tensor):
        img, txt, logit_scale, logit_bias = ctx.saved_tensors
        o, s, saved = ctx.o, ctx.s, ctx.saved
        g = grad_loss.float().reshape(())
        d_bias = None
        if o.loss == "clip":
            d_img, d_txt, d_scale = _clip_backward(g, img, txt, s, saved, o)
        else:
            d_img, d_txt, d_scale, d_bias = _siglip_backward(g, img, txt, s, ctx.bias, saved, o)
            d_bias = d_bias.reshape(logit_bias.shape).to(logit_bias.dtype)
        ctx.saved = None
        return (d_img.to(img.dtype), d_txt.to(txt.dtype),
                d_scale.reshape(logit_scale.shape).to(logit_scale.dtype), d_bias, None)


def distributed_contrastive_loss(image_features: Tensor, text_features: Tensor, logit_scale: Tensor,
                                 logit_bias: Optional[Tensor] = None, *, scheme: str = "ring",
                                 loss: str = "clip", impl: str = "chunked_torch",
                                 label_smoothing: float = 0.0, allow_tf32: bool = False,
                                 block_m: int = 0, block_n: int = 0, process_group=None,
                                 local_world_size: Optional[int] = None,
                                 grad_reduction: str = "mean") -> Tensor:
    """The CLIP / SigLIP loss of the global batch spread over ``process_group``.

    image_features, text_features: [b, D] this rank's local batch (same b and D on every rank);
    logit_scale: [] or [1] (the multiplier); logit_bias: [] or [1] (siglip). ``impl`` must be
    an implementation that runs here ("naive", "chunked_torch", "triton"; resolve "auto"
    first). Returns the 0-dim fp32 loss of the global batch, identical on every rank; see the
    module docstring for the gradient convention (``grad_reduction`` "mean" or "sum").
    """
    if scheme not in SCHEMES:
        raise ValueError(f"unknown distributed scheme {scheme!r}; choose from {SCHEMES}")
    if loss not in ("clip", "siglip"):
        raise ValueError(f"unknown loss {loss!r}; choose 'clip' or 'siglip'")
    if impl not in ("naive", "chunked_torch", "triton"):
        raise ValueError(f"impl must be 'naive', 'chunked_torch' or 'triton' (resolve 'auto' with "
                         f"ops.resolve_impl first), got {impl!r}")
    if grad_reduction not in ("mean", "sum"):
        raise ValueError(f"grad_reduction must be 'mean' or 'sum', got {grad_reduction!r}")
    if loss == "siglip" and logit_bias is None:
        raise ValueError("loss 'siglip' needs logit_bias")
    if loss == "siglip" and label_smoothing:
        raise ValueError("label_smoothing applies to loss 'clip' only")
    if image_features.shape != text_features.shape or image_features.dim() != 2:
        raise ValueError(f"features must both be [b, D]; got image {tuple(image_features.shape)}, "
                         f"text {tuple(text_features.shape)}")
    topo = topology(process_group, scheme, local_world_size)
    _check_sizes(image_features, topo, scheme)
    o = _Options(scheme, loss, impl, float(label_smoothing), bool(allow_tf32), int(block_m or 0),
                 int(block_n or 0), topo, float(topo.world if grad_reduction == "mean" else 1))
    return _DistributedContrastiveLoss.apply(image_features, text_features, logit_scale,
                                             logit_bias if loss == "siglip" else None, o)
