"""Image-text retrieval metrics (R@K, median rank) computed in query chunks.

Design: for N paired features (image i belongs with caption i), the rank of the true match of
query i is the number of candidates that score strictly higher, plus the number that tie with it
at a lower index (a deterministic tie rule: equal scores are ordered by index, so a constant
model ranks query i at position i, not at 0). The similarity matrix is never built whole: queries
are taken ``chunk_size`` at a time against all N candidates (a ``chunk_size x N`` block), and only
the N integer ranks are kept, so 100k+ pairs fit in memory (chunk 1024 x 100k fp32 = 400 MB).

Limit: one caption per image. Data sets with several captions per image (COCO's five) need a
many-to-many ground truth (an image is right for any of its captions); pass one caption per image
or pre-select one.
"""

from __future__ import annotations

from typing import Dict, Sequence

import torch
from torch import Tensor

__all__ = ["retrieval_ranks", "retrieval_metrics", "ranks_to_metrics"]

DEFAULT_KS = (1, 5, 10)


def retrieval_ranks(queries: Tensor, candidates: Tensor, chunk_size: int = 1024) -> Tensor:
    """0-based rank of candidate i for query i, for every i.

    Args:
        queries: [N, E] features (query i's match is ``candidates[i]``).
        candidates: [N, E] features, same row order.
        chunk_size: queries per block; peak extra memory is ``chunk_size x N`` scores.
    Returns:
        LongTensor [N] on the CPU: ``#{j: s_ij > s_ii} + #{j < i: s_ij == s_ii}``.
    """
    if queries.ndim != 2 or candidates.ndim != 2 or queries.shape != candidates.shape:
        raise ValueError(f"queries and candidates must both be [N, E] of one shape, got "
                         f"{tuple(queries.shape)} and {tuple(candidates.shape)}")
    if chunk_size < 1:
        raise ValueError(f"chunk_size must be >= 1, got {chunk_size}")
    n = queries.shape[0]
    cand = candidates.float()
    ranks = torch.empty(n, dtype=torch.long)
    col = torch.arange(n, device=cand.device)
    for start in range(0, n, chunk_size):
        stop = min(start + chunk_size, n)
        scores = queries[start:stop].float() @ cand.T  # [c, N]
        rows = torch.arange(start, stop, device=cand.device)
        true = scores[rows - start, rows].unsqueeze(1)  # [c, 1]
        higher = (scores > true).sum(dim=1)
        ties_before = ((scores == true) & (col.unsqueeze(0) < rows.unsqueeze(1))).sum(dim=1)
        ranks[start:stop] = (higher + ties_before).cpu()
    return ranks


def ranks_to_metrics(ranks: Tensor, prefix: str, ks: Sequence[int] = DEFAULT_KS) -> Dict[str, float]:
    """``{prefix}_r{k}`` = fraction of queries with 0-based rank < k; ``{prefix}_median_rank``
    = median of the 1-based ranks (the mean of the two middle values for even N)."""
    if ranks.numel() == 0:
        raise ValueError("no queries: retrieval needs at least one image-text pair")
    out = {f"{prefix}_r{k}": float((ranks < k).double().mean()) for k in ks}
    one_based = (ranks + 1).double().sort().values
    n = one_based.numel()
    mid = n // 2
    median = one_based[mid] if n % 2 else (one_based[mid - 1] + one_based[mid]) / 2
    out[f"{prefix}_median_rank"] = float(median)
    return out


def retrieval_metrics(image_features: Tensor, text_features: Tensor, chunk_size: int = 1024,
                      ks: Sequence[int] = DEFAULT_KS) -> Dict[str, float]:
    """Image->text (``i2t_*``) and text->image (``t2i_*``) R@K and median rank over N pairs.

    Args:
        image_features, text_features: [N, E], L2-normalised, row i of each is one pair.
    Returns:
        ``{"i2t_r1", "i2t_r5", "i2t_r10", "i2t_median_rank", "t2i_r1", ..., "n_pairs"}``.
    """
    out = ranks_to_metrics(retrieval_ranks(image_features, text_features, chunk_size), "i2t", ks)
    out.update(ranks_to_metrics(retrieval_ranks(text_features, image_features, chunk_size), "t2i", ks))
    out["n_pairs"] = float(image_features.shape[0])
    return out
