"""Process groups the distributed loss and the training loop share: the sub-groups of a
hierarchical layout (one intra-node and one inter-node group per rank) and a host twin of an NCCL
group (gloo, same ranks) for exchanging CPU tensors without waiting on the GPU's queue.

One role: making and caching process groups. Both kinds are built with plain ``new_group``,
which is collective over the whole world: every rank of the world creates every rank's groups,
in the same order, so the first call must be made on all ranks of the world (as data-parallel
training does). Cached groups are dropped at exit while the interpreter is whole.
"""

from __future__ import annotations

import atexit
import logging

import torch
import torch.distributed as dist

__all__ = ["all_gather_single", "reduce_scatter_single", "host_group", "node_subgroups"]

log = logging.getLogger(__name__)

# torch >= 2.13 renames the tensor-in/tensor-out collectives; the GPU machine runs 2.11.
all_gather_single = getattr(dist, "all_gather_single", None) or dist.all_gather_into_tensor
reduce_scatter_single = getattr(dist, "reduce_scatter_single", None) or dist.reduce_scatter_tensor

_SUBGROUPS: dict = {}
_HOST_TWINS: dict = {}


@atexit.register
def _release_cached_groups() -> None:
    """Drop the cached groups while the interpreter is whole. A gloo group still referenced when
    the interpreter finalizes can abort the process: its worker thread frees a finished
    collective's tensors, needs the GIL to do it and exits mid-destructor (std::terminate)."""
    _SUBGROUPS.clear()
    _HOST_TWINS.clear()


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
    every = torch.empty(world * (world + 2), dtype=torch.int64, device=mine.device)  # flat: gloo wants 1-D
    all_gather_single(every, mine)
    out = {(tuple(row[2:2 + row[1]]), row[0]) for row in every.view(world, world + 2).tolist()}
    return sorted(out)


def node_subgroups(group, ranks: tuple, local: int):
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


def host_group(group):
    """A group on which CPU tensors can be exchanged between the ranks of ``group`` (None: the
    world): ``group`` itself unless its backend is NCCL alone, else a gloo twin with the same
    ranks, built once and cached. Built like the hierarchical sub-groups (every rank of the world
    creates the twin of every rank's group, in the same order): the first call must be made on
    all ranks of the world."""
    if dist.get_backend(group) != "nccl":
        return group
    ranks = tuple(dist.get_process_group_ranks(group if group is not None else dist.group.WORLD))
    twin = _HOST_TWINS.get(ranks)
    if twin is not None and _alive(twin):
        return twin
    me = dist.get_rank()
    for lay_ranks, _ in _layouts(group, ranks, 1):
        pg = dist.new_group(list(lay_ranks), backend="gloo")
        if me in lay_ranks:
            _HOST_TWINS[lay_ranks] = pg
    return _HOST_TWINS[ranks]
