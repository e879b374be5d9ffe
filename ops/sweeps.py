"""How the column blocks of S reach a rank: the sweeps of the distributed contrastive loss.

One role: communication. A sweep runs a step function on every column block of the global
batch against this rank's rows and brings each block's column partials home to the block's
owner; the loss assembly (ops/assembly.py) is written once against the :class:`Sweep`
interface and never asks which scheme it runs (only what the sweep's class attributes allow). The scheme string is parsed here and only here
(:func:`sweep_class`), once per call, into one of

    Local              every block on this device (no process group; world size 1)
    Gathered           "disco": all-gather the column blocks, a step per block, each
                       block's column partials reduced to its owner under the next block's
                       compute (TUNING.disco_pipelined; or one step on all B columns and a
                       reduce-scatter)
    GatheredRowsAndColumns
                       "gather": as Gathered, and the rows are gathered too so each rank also
                       computes its columns against all rows (OpenCLIP's local loss)
    Ring               column blocks travel round a ring of the group, the next transfer posted
                       before the compute on the block in hand (partials travel with them)
    HierarchicalRing   the same ring nested: node blocks round an inter-node ring, each going
                       round the intra-node ring

Schedules, memory and traffic: docs/distributed.md. :class:`Scheme` is what the public API
chooses (strings and ints only, so torch.compile traces it as constants and the registered op
can carry it); :func:`make_sweep` builds the sweep with its Topology inside the op.
Limits: consecutive group ranks share a node (what torchrun and the deepspeed launcher do for
the world group); the first hierarchical call with a new layout creates sub-groups with a
collective over the whole world, and so does the first call on an NCCL group (a gloo twin for
the per-call size check, which then never waits on the GPU).
"""

from __future__ import annotations

import dataclasses
import functools
import logging
import os
from typing import Callable, ClassVar, List, Optional, Sequence

import torch
import torch.distributed as dist
from torch import Tensor

from .process_groups import all_gather_single, host_group, node_subgroups, reduce_scatter_single
from .tuning import TUNING

__all__ = [
    "SCHEMES",
    "Scheme",
    "Sweep",
    "Local",
    "Gathered",
    "GatheredRowsAndColumns",
    "Ring",
    "HierarchicalRing",
    "Topology",
    "all_gather",
    "choose_scheme",
    "launcher_local_world_size",
    "make_sweep",
    "reduce_scatter",
    "resolve_group",
    "ring_sweep",
    "scheme_of",
    "sweep_class",
    "topology",
]

log = logging.getLogger(__name__)


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


# Ranks per node as the launchers export it: torchrun, the deepspeed launcher, OpenMPI.
_LOCAL_SIZE_ENV = ("LOCAL_WORLD_SIZE", "LOCAL_SIZE", "OMPI_COMM_WORLD_LOCAL_SIZE")


def launcher_local_world_size() -> Optional[int]:
    """Processes per node from the launcher's environment (None when no launcher says)."""
    for name in _LOCAL_SIZE_ENV:
        value = os.environ.get(name)
        if value:
            return int(value)
    return None


def topology(process_group=None, ranks_per_node: Optional[int] = None) -> Topology:
    """The Topology of ``process_group`` (None: the world) with nodes of ``ranks_per_node``
    consecutive group ranks (None: one node holding the whole group; the hierarchical sweep
    chooses it, :meth:`HierarchicalRing.ranks_per_node`). The first call with a new layout of
    more than one node and more than one rank per node creates the sub-groups: a collective over
    the whole world (every rank must make that call)."""
    if not (dist.is_available() and dist.is_initialized()):
        raise RuntimeError("distributed contrastive loss needs an initialised torch.distributed "
                           "process group (dist.init_process_group)")
    group = process_group
    world = dist.get_world_size(group)
    rank = dist.get_rank(group)
    ranks = tuple(dist.get_process_group_ranks(group if group is not None else dist.group.WORLD))
    local = world if ranks_per_node is None else ranks_per_node
    if local < 1 or world % local:
        raise ValueError(f"{world} ranks do not split into nodes of {local}")
    if local == world:  # one node: the whole ring is intra-node
        intra, inter = group, None
    elif local == 1:  # one rank per node: the whole ring is inter-node
        intra, inter = None, group
    else:
        intra, inter = node_subgroups(group, ranks, local)
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


def ring_sweep(topo: Topology, block: List[Tensor], fn: StepFn, merge: str = "sum") -> List[Tensor]:
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


def _gather_into(x: Tensor, topo: Topology, out: Optional[Tensor] = None, async_op: bool = False):
    """(out, work): the all-gather of ``x`` over ``topo``'s group into ``out`` ([world b, ...],
    allocated if None); with ``async_op`` only started (``work.wait()`` before reading ``out``;
    with NCCL the stream waits, not the host), else done (``work`` None)."""
    if out is None:
        out = x.new_empty((topo.world * x.shape[0],) + tuple(x.shape[1:]))
    return out, all_gather_single(out, x.contiguous(), group=topo.group, async_op=async_op)


def all_gather(x: Tensor, topo: Topology, out: Optional[Tensor] = None) -> Tensor:
    return _gather_into(x, topo, out)[0]


def _reduce_op(merge: str):
    """The collective's reduction for a sweep's ``merge`` ("sum" or "max")."""
    return dist.ReduceOp.SUM if merge == "sum" else dist.ReduceOp.MAX


def reduce_scatter(x: Tensor, topo: Topology, merge: str = "sum") -> Tensor:
    out = x.new_empty((x.shape[0] // topo.world,) + tuple(x.shape[1:]))
    reduce_scatter_single(out, x.contiguous(), op=_reduce_op(merge), group=topo.group)
    return out


# ----------------------------------------------------------------------------------------------
# The sweep classes: one per scheme, chosen once
# ----------------------------------------------------------------------------------------------
class Sweep:
    """Rank r's rows against every column block of the group, and the collectives the loss
    assembly needs. Class attributes say what the assembly may do and must keep: ``in_place``
    (one step on this rank's own block, whose partials :meth:`columns` returns as the step made
    them: the step may write its results where they are finally read), ``gathers_columns`` (the all-gathered column block [B, ...] is returned by :meth:`columns`
    and may be handed back to it) and ``gathers_rows`` (gather: rank r also computes its columns
    against all rows, from all-gathered rows)."""

    name: ClassVar[str]
    in_place: ClassVar[bool] = False
    gathers_columns: ClassVar[bool] = False
    gathers_rows: ClassVar[bool] = False

    def __init__(self, topo: Optional[Topology]):
        self.topo = topo

    @classmethod
    def ranks_per_node(cls, world: int, local_world_size: Optional[int]) -> int:
        return world

    @classmethod
    def build(cls, process_group=None, local_world_size: Optional[int] = None) -> "Sweep":
        world = dist.get_world_size(process_group)
        return cls(topology(process_group, cls.ranks_per_node(world, local_world_size)))

    @property
    def world(self) -> int:
        return self.topo.world

    @property
    def rank(self) -> int:
        return self.topo.rank

    def columns(self, block: List[Tensor], fn: StepFn, merge: str = "sum",
                kept: Optional[List[Tensor]] = None) -> tuple:
        """Run ``fn(col_offset, held)`` on every column block; returns (this rank's own
        block's column partials merged over all ranks, the gathered block or None). ``kept``:
        the gathered block of an earlier call (gathered sweeps only; None entries are gathered
        now)."""
        raise NotImplementedError

    def all_gather(self, x: Tensor, out: Optional[Tensor] = None) -> Tensor:
        """x of every rank, concatenated in rank order (into ``out`` when given)."""
        return all_gather(x, self.topo, out)

    def reduce_scatter(self, x: Tensor, merge: str = "sum") -> Tensor:
        return reduce_scatter(x, self.topo, merge)

    def max_(self, x: Tensor) -> Tensor:
        """In place: the elementwise max over the group."""
        dist.all_reduce(x, op=dist.ReduceOp.MAX, group=self.topo.group)
        return x

    def sum(self, x: Tensor) -> Tensor:
        """The sum over the group, in fp64 (a new tensor)."""
        out = x.double()
        dist.all_reduce(out, group=self.topo.group)
        return out

    def check_sizes(self, x: Tensor) -> None:
        """Raise ValueError on every rank unless every rank holds the same [b, D]. The sizes go
        round on the host (a gloo twin of an NCCL group, :func:`host_group`): reading them
        from the GPU would make the host wait for all queued work at every call (0.4-1.5 ms a
        call of ring / disco on 2 x H200 at B = 32k-65k)."""
        mine = torch.tensor([x.shape[0], x.shape[1]], dtype=torch.int64)
        every = torch.empty(2 * self.world, dtype=torch.int64)
        all_gather_single(every, mine, group=host_group(self.topo.group))
        sizes = every.view(self.world, 2).tolist()
        if any(s != sizes[0] for s in sizes):
            listing = ", ".join(f"rank {r}: {s[0]} x {s[1]}" for r, s in enumerate(sizes))
            raise ValueError(f"distributed contrastive loss ({self.name}) needs the same local "
                             f"batch [b, D] on every rank of the group; got {listing}")


class Local(Sweep):
    """All blocks on this device: one step on the whole batch, collectives are identities."""

    name = "none"
    in_place = True
    world = 1  # (plain attributes over the base class's properties)
    rank = 0

    @classmethod
    def build(cls, process_group=None, local_world_size: Optional[int] = None) -> "Sweep":
        return _LOCAL

    def columns(self, block, fn, merge="sum", kept=None):
        return fn(0, list(block)), None

    def all_gather(self, x, out=None):
        return x if out is None else out.copy_(x)

    def reduce_scatter(self, x, merge="sum"):
        return x

    def max_(self, x):
        return x

    def sum(self, x):
        return x.double()

    def check_sizes(self, x):
        return None


_LOCAL = Local(None)  # (stateless: one instance serves every call)


class Gathered(Sweep):
    """disco: all-gather the column blocks, each rank's rows against all B columns, the column
    partials summed at their owner (DisCo-CLIP, SUM not AVG); the schedule: TUNING.disco_pipelined."""

    name = "disco"
    gathers_columns = True

    def columns(self, block, fn, merge="sum", kept=None):
        if not TUNING.disco_pipelined:
            full = [g if g is not None else self.all_gather(x)
                    for x, g in zip(block, kept or [None] * len(block))]
            parts = fn(0, full)
            return [self.reduce_scatter(p, merge) for p in parts], full
        return self._pipelined(block, fn, merge, kept or [None] * len(block))

    def _pipelined(self, block, fn, merge, kept):
        """A step per column block, each block's partials reduced to its owner (an asynchronous
        reduce, issued in rank order on every rank, as collectives need) while the next block is
        computed. With something to gather (not ``kept``) the own block goes first, on the local
        tensors, while the all-gather runs; else the blocks go in rank order, so that each
        reduce can start as soon as its block is done everywhere and only the last one is left
        exposed. The own partials are the root's buffers of their reduce and end up holding the
        sums. Memory: the gathered block, the own partials and TUNING.reduces_in_flight others."""
        b, group = block[0].shape[0], self.topo.group
        full, gathers = [], []
        for x, g in zip(block, kept):
            if g is None:
                g, work = _gather_into(x, self.topo, async_op=True)
                gathers.append(work)
            full.append(g)
        order = list(range(self.world))
        if gathers:
            order.remove(self.rank)
            order.insert(0, self.rank)
        op = _reduce_op(merge)
        done: dict = {}  # block -> its partials, until reduced
        flying: List[tuple] = []  # (work, the partial it reads) of other owners, oldest first
        mine: list = []
        reduced = 0  # the blocks before this one have their reduces issued
        for q in order:
            if q == self.rank:
                done[q] = own = fn(q * b, list(block))
                for work in gathers:  # (the own block overlapped them)
                    work.wait()
            else:
                done[q] = fn(q * b, [x[q * b:(q + 1) * b] for x in full])
            while reduced in done:
                parts = done.pop(reduced)
                for p in parts:
                    work = dist.reduce(p, dst=self.topo.ranks[reduced], op=op, group=group, async_op=True)
                    (mine if reduced == self.rank else flying).append((work, p))
                reduced += 1
                while len(flying) > TUNING.reduces_in_flight * max(len(parts), 1):
                    flying.pop(0)[0].wait()  # (NCCL: the stream waits, not the host)
        for work, _ in flying + mine:
            work.wait()
        return own, full


class GatheredRowsAndColumns(Gathered):
    """gather: as :class:`Gathered`, and the rows are gathered too (the assembly computes rank
    r's columns against all rows: two b x B blocks, OpenCLIP's local loss)."""

    name = "gather"
    gathers_rows = True


class Ring(Sweep):
    """ring: column blocks round the group (:func:`ring_sweep`, one node)."""

    name = "ring"

    def columns(self, block, fn, merge="sum", kept=None):
        return ring_sweep(self.topo, block, fn, merge), None


class HierarchicalRing(Ring):
    """hierarchical_ring: nodes of ``ranks_per_node`` ranks; a ring of node blocks between
    nodes, each node block round the ring inside its node."""

    name = "hierarchical_ring"

    @classmethod
    def ranks_per_node(cls, world: int, local_world_size: Optional[int]) -> int:
        """``local_world_size``, else the launcher's LOCAL_WORLD_SIZE / LOCAL_SIZE /
        OMPI_COMM_WORLD_LOCAL_SIZE, else the whole group; capped at the group size."""
        local = local_world_size or launcher_local_world_size() or world
        if local < 1:
            raise ValueError(f"local_world_size must be >= 1, got {local}")
        if local >= world:
            return world
        if world % local:
            raise ValueError(f"hierarchical_ring: the group has {world} ranks, not a multiple of "
                             f"local_world_size={local} (ranks per node); set "
                             "contrastive_loss.local_world_size to the GPUs per node")
        return local


_SWEEPS = {cls.name: cls for cls in (Local, GatheredRowsAndColumns, Gathered, Ring, HierarchicalRing)}
SCHEMES = tuple(name for name in _SWEEPS if name != "none")
"""The distributed schemes (``distributed`` values other than "none")."""


def sweep_class(name: str) -> type:
    """The sweep class of a ``distributed`` value: the one place the scheme string is parsed."""
    cls = _SWEEPS.get(name)
    if cls is None:
        raise ValueError(f"unknown distributed scheme {name!r}; choose from {tuple(_SWEEPS)}")
    return cls


def resolve_group(group_name: str):
    """The process group named ``group_name`` (``group.group_name``; "" for no group)."""
    if not group_name:
        return None
    return dist.distributed_c10d._resolve_process_group(group_name)


def make_sweep(name: str, process_group=None, local_world_size: Optional[int] = None) -> Sweep:
    """The sweep of scheme ``name`` over ``process_group`` (None: the world), with its
    Topology (a hierarchical layout's first use creates sub-groups: collective on the world)."""
    return sweep_class(name).build(process_group, local_world_size)


@dataclasses.dataclass(frozen=True)
class Scheme:
    """The scheme the public API chose, parsed once: plain values, so torch.compile traces its
    choice as constants and the registered op carries it as primitive arguments (``group_name``:
    the group's name, "" for Local; ``local_world_size``: 0 for "from the launcher"). The op turns
    its arguments back into a Scheme at its boundary (:func:`scheme_of`) and hands the object on."""

    name: str
    group_name: str = ""
    local_world_size: int = 0

    @property
    def local(self) -> bool:
        return self.name == Local.name

    @property
    def sweep_class(self) -> type:
        """The :class:`Sweep` class of this scheme (its name was checked when it was parsed)."""
        return _SWEEPS[self.name]

    def make_sweep(self) -> Sweep:
        """This scheme's sweep over its process group, with its Topology (a hierarchical layout's
        first use creates sub-groups: collective on the world)."""
        return self.sweep_class.build(resolve_group(self.group_name), self.local_world_size or None)


@functools.lru_cache(maxsize=64)
def scheme_of(name: str, group_name: str = "", local_world_size: int = 0) -> Scheme:
    """The registered op's scheme arguments as a :class:`Scheme`, the name checked
    (:func:`sweep_class`): once per distinct value, not per call (cached)."""
    sweep_class(name)
    return Scheme(name, group_name, int(local_world_size))


def choose_scheme(distributed: str, process_group=None, local_world_size: Optional[int] = None,
                  *, world_one_is_local: bool = True) -> Scheme:
    """Parse ``distributed`` once: Local for "none", for no initialised process group, or (with
    ``world_one_is_local``) a group of one rank; else the scheme over ``process_group``."""
    cls = sweep_class(distributed)
    if cls is Local or not (dist.is_available() and dist.is_initialized()):
        if cls is not Local and not world_one_is_local:
            raise RuntimeError("distributed contrastive loss needs an initialised "
                               "torch.distributed process group (dist.init_process_group)")
        return Scheme(Local.name)
    if world_one_is_local and dist.get_world_size(process_group) == 1:
        return Scheme(Local.name)
    group = process_group if process_group is not None else dist.distributed_c10d._get_default_group()
    return Scheme(cls.name, group.group_name, int(local_world_size or 0))
