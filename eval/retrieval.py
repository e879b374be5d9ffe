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

from typing import TYPE_CHECKING, Dict, Iterable, List, Optional, Sequence, Tuple

import torch
from torch import Tensor

from .features import idle_forward, image_features, text_features

if TYPE_CHECKING:
    from .distributed import RankSync

__all__ = ["encode_pairs", "ranks_to_metrics", "retrieval_eval", "retrieval_metrics", "retrieval_ranks"]

DEFAULT_KS = (1, 5, 10)


def retrieval_ranks(queries: Tensor, candidates: Tensor, chunk_size: int = 1024, offset: int = 0) -> Tensor:
    """0-based rank of each query's true candidate.

    Args:
        queries: [Q, E] features; query q's match is ``candidates[offset + q]``.
        candidates: [N, E] features (N >= offset + Q).
        chunk_size: queries per block; peak extra memory is ``chunk_size x N`` scores.
        offset: index of query 0's match (a rank that owns rows offset..offset+Q-1).
    Returns:
        LongTensor [Q] on the CPU: ``#{j: s_qj > s_qt} + #{j < t: s_qj == s_qt}``, t = offset + q.
    """
    if queries.ndim != 2 or candidates.ndim != 2 or queries.shape[1] != candidates.shape[1]:
        raise ValueError(f"queries and candidates must be [Q, E] and [N, E], got "
                         f"{tuple(queries.shape)} and {tuple(candidates.shape)}")
    if offset < 0 or offset + queries.shape[0] > candidates.shape[0]:
        raise ValueError(f"queries {offset}..{offset + queries.shape[0]} fall outside the "
                         f"{candidates.shape[0]} candidates")
    if chunk_size < 1:
        raise ValueError(f"chunk_size must be >= 1, got {chunk_size}")
    n_q = queries.shape[0]
    cand = candidates.float()
    ranks = torch.empty(n_q, dtype=torch.long)
    col = torch.arange(cand.shape[0], device=cand.device)
    for start in range(0, n_q, chunk_size):
        stop = min(start + chunk_size, n_q)
        scores = queries[start:stop].to(cand.device).float() @ cand.T  # [c, N]
        local = torch.arange(stop - start, device=cand.device)
        target = local + start + offset
        true = scores[local, target].unsqueeze(1)  # [c, 1]
        higher = (scores > true).sum(dim=1)
        ties_before = ((scores == true) & (col.unsqueeze(0) < target.unsqueeze(1))).sum(dim=1)
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
    if image_features.shape != text_features.shape:
        raise ValueError(f"image and text features must pair up row by row, got "
                         f"{tuple(image_features.shape)} and {tuple(text_features.shape)}")
    out = ranks_to_metrics(retrieval_ranks(image_features, text_features, chunk_size), "i2t", ks)
    out.update(ranks_to_metrics(retrieval_ranks(text_features, image_features, chunk_size), "t2i", ks))
    out["n_pairs"] = float(image_features.shape[0])
    return out


@torch.no_grad()
def encode_pairs(model, batches: Iterable[Dict], sync: "RankSync", *, device: torch.device,
                 dtype: torch.dtype, max_samples: Optional[int] = None) -> Tuple[Tensor, Tensor]:
    """Features of this rank's image-text pairs: ``([n, E], [n, E])`` fp32 on ``device``.

    ``batches`` yield ``pixel_values`` [B,3,H,W], ``input_ids`` / ``attention_mask`` [B,L] (as
    ``pipeline.data.build_eval_loader`` does). All ranks run the same number of forwards (see
    :class:`eval.distributed.RankSync`); a rank stops taking data after ``max_samples``.
    """
    imgs: List[Tensor] = []
    txts: List[Tensor] = []
    idle = lambda: idle_forward(model, device, dtype, text=True)  # noqa: E731 (ZeRO-3 lockstep)
    for batch, take in sync.lockstep(batches, max_samples, idle):
        pv = batch["pixel_values"][:take].to(device=device, dtype=dtype)
        ids = batch["input_ids"][:take].to(device)
        mask = batch["attention_mask"][:take].to(device)
        imgs.append(image_features(model, pv))
        txts.append(text_features(model, ids, mask))
    width = int(model.embed_dim)
    empty = torch.zeros(0, width, device=device)
    return (torch.cat(imgs) if imgs else empty), (torch.cat(txts) if txts else empty)


def retrieval_eval(model, batches: Iterable[Dict], sync: "RankSync", *, device: torch.device,
                   dtype: torch.dtype, max_samples: Optional[int] = None, chunk_size: int = 1024,
                   ks: Sequence[int] = DEFAULT_KS) -> Dict[str, float]:
    """Encode the pairs (split over ranks when ``sync.active``), gather every rank's features,
    rank this rank's queries against all candidates, and merge: every rank returns the metrics
    of all N pairs."""
    img, txt = encode_pairs(model, batches, sync, device=device, dtype=dtype, max_samples=max_samples)
    all_img, offset = sync.gather_rows(img)
    all_txt, _ = sync.gather_rows(txt)
    if all_img.shape[0] == 0:
        raise ValueError("retrieval: the shards gave no image-text pair")
    i2t = retrieval_ranks(img, all_txt, chunk_size, offset)
    t2i = retrieval_ranks(txt, all_img, chunk_size, offset)
    i2t, _ = sync.gather_rows(i2t.to(device))
    t2i, _ = sync.gather_rows(t2i.to(device))
    out = ranks_to_metrics(i2t.cpu(), "i2t", ks)
    out.update(ranks_to_metrics(t2i.cpu(), "t2i", ks))
    out["n_pairs"] = float(all_img.shape[0])
    return out
