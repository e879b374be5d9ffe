"""Keeping ranks in step during evaluation, and merging their results.

Design: under ZeRO-3 every forward pass gathers parameters with collectives, so all ranks must
run the same number of forwards in the same order, even when their shares of the eval data
differ in length. :meth:`RankSync.any` runs one small all-reduce per batch ("does any rank
still have data?"); a rank that ran out does a one-row dummy forward instead, so the collectives
line up. Counts merge by an integer all-reduce (exact); variable-length feature blocks are gathered
with padding (tensors only, nothing pickled). Without an initialised process group (or with one
rank) every call is a no-op.

Limit: the per-batch all-reduce costs one tiny collective per eval batch (negligible next to a
forward pass).
"""

from __future__ import annotations

from typing import Callable, Dict, Iterable, Iterator, List, Optional, Tuple

import torch
import torch.distributed as dist
from torch import Tensor

__all__ = ["RankSync"]


class RankSync:
    """Rank, world size and the collectives the eval loops need.

    ``active`` is False for a single process or when ``split`` is False (each rank then evaluates
    everything on its own, and no collective is issued).
    """

    def __init__(self, split: bool = True, device: Optional[torch.device] = None) -> None:
        initialised = dist.is_available() and dist.is_initialized()
        self.rank = dist.get_rank() if initialised else 0
        self.world = dist.get_world_size() if initialised else 1
        self.active = initialised and self.world > 1 and split
        if not self.active:
            self.rank, self.world = 0, 1
        self.device = torch.device("cpu")
        if self.active and dist.get_backend() == "nccl":
            self.device = device if device is not None and device.type == "cuda" else \
                torch.device("cuda", torch.cuda.current_device())

    def any(self, have: bool) -> bool:
        """True while any rank still has a batch (this rank's ``have`` alone without a group).

        Call once per loop turn on every rank; a rank with nothing left then runs a dummy forward
        so that ZeRO-3's parameter gathers stay paired across ranks."""
        if not self.active:
            return have
        flag = torch.tensor([1 if have else 0], dtype=torch.int32, device=self.device)
        dist.all_reduce(flag, op=dist.ReduceOp.MAX)
        return bool(flag.item())

    def lockstep(self, batches: Iterable[Dict], max_samples: Optional[int],
                 idle: Callable[[], None]) -> Iterator[Tuple[Dict, int]]:
        """Yield ``(batch, take)`` (use the first ``take`` rows) until every rank is out of data
        or past ``max_samples``; on turns where this rank has nothing left ``idle()`` runs (a
        dummy forward), so all ranks make the same number of turns."""
        seen = 0
        it = iter(batches)
        while True:
            batch = next(it, None) if max_samples is None or seen < max_samples else None
            if not self.any(batch is not None):
                return
            if batch is None:
                idle()
                continue
            rows = batch["pixel_values"].shape[0]
            take = rows if max_samples is None else min(rows, max_samples - seen)
            seen += take
            yield batch, take

    def sum_(self, tensor: Tensor) -> Tensor:
        """In-place sum over ranks (returns ``tensor`` on its own device)."""
        if not self.active:
            return tensor
        moved = tensor.to(self.device)
        dist.all_reduce(moved, op=dist.ReduceOp.SUM)
        tensor.copy_(moved.to(tensor.device))
        return tensor

    def gather_rows(self, tensor: Tensor) -> Tuple[Tensor, int]:
        """Concatenate every rank's [n_r, ...] block in rank order on every rank.

        Returns ``(all_rows [sum n_r, ...] on tensor's device, offset of this rank's rows)``."""
        if not self.active:
            return tensor, 0
        n = torch.tensor([tensor.shape[0]], dtype=torch.long, device=self.device)
        sizes = [torch.zeros_like(n) for _ in range(self.world)]
        dist.all_gather(sizes, n)
        counts = [int(s.item()) for s in sizes]
        biggest = max(counts)
        padded = torch.zeros((biggest,) + tuple(tensor.shape[1:]), dtype=tensor.dtype, device=self.device)
        padded[: tensor.shape[0]] = tensor.to(self.device)
        blocks: List[Tensor] = [torch.empty_like(padded) for _ in range(self.world)]
        dist.all_gather(blocks, padded)
        rows = torch.cat([b[:c] for b, c in zip(blocks, counts)]).to(tensor.device)
        return rows, sum(counts[: self.rank])

    def share(self, total: Optional[int]) -> Optional[int]:
        """This rank's part of a sample budget ``total`` split as evenly as possible."""
        if total is None:
            return None
        return total // self.world + (1 if self.rank < total % self.world else 0)
