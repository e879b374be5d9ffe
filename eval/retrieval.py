"""Image-text retrieval metrics (R@K, median rank) computed in query chunks.

Design: for N paired features (image i belongs with caption i), the rank of the true match of
query i is the number of candidates that score strictly higher, plus the number that tie with it
at a lower index (a deterministic tie rule: equal scores are ordered by index, so a constant
model ranks query i at position i, not at 0). The similarity matrix is never built whole: queries
are taken ``chunk_size`` at a time against all N candidates (a ``chunk_size x N`` block), and only
the N integer ranks are kept, so 100k+ pairs fit in memory (chunk 1024 x 100k fp32 = 400 MB).

Several captions per image (CLIP_benchmark's retrieval sets, COCO's five): every caption is a
text row mapped to its image (``text_image[t]``). Text->image ranks the caption's own image as
usual; image->text takes the best-ranked of the image's captions (a hit at k when any of them is
within k; the tie rule as above). One caption per image gives exactly the one-to-one ranks. The
report carries CLIP_benchmark's names (``image_retrieval_recall@k``: text->image,
``text_retrieval_recall@k``: image->text) and OpenCLIP's mean / median rank besides the
project's ``i2t_*`` / ``t2i_*`` keys (:func:`benchmark_metrics`).
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING, Any, Dict, Iterable, List, Optional, Sequence, Tuple

import torch
from torch import Tensor

from infclip.pipeline.errors import DataError

from .features import idle_forward, image_features, text_features

if TYPE_CHECKING:
    from .distributed import RankSync

__all__ = ["benchmark_metrics", "encode_pairs", "image_to_text_ranks", "ranks_to_metrics", "retrieval_eval",
           "retrieval_metrics", "retrieval_ranks", "text_to_image_ranks"]

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


def _check_pair(queries: Tensor, candidates: Tensor) -> None:
    if queries.ndim != 2 or candidates.ndim != 2 or queries.shape[1] != candidates.shape[1]:
        raise ValueError(f"queries and candidates must be [Q, E] and [N, E], got "
                         f"{tuple(queries.shape)} and {tuple(candidates.shape)}")


def text_to_image_ranks(texts: Tensor, images: Tensor, text_image: Tensor, chunk_size: int = 1024) -> Tensor:
    """0-based rank of each text's own image (``images[text_image[t]]``) among all images, with
    the index tie rule. Returns LongTensor [T] on the CPU."""
    _check_pair(texts, images)
    text_image = text_image.long().to(images.device)
    if text_image.numel() != texts.shape[0]:
        raise ValueError(f"text_image has {text_image.numel()} entries for {texts.shape[0]} texts")
    if text_image.numel() and (text_image.min() < 0 or text_image.max() >= images.shape[0]):
        raise ValueError("text_image points outside the images")
    cand = images.float()
    col = torch.arange(cand.shape[0], device=cand.device)
    ranks = torch.empty(texts.shape[0], dtype=torch.long)
    for start in range(0, texts.shape[0], chunk_size):
        stop = min(start + chunk_size, texts.shape[0])
        scores = texts[start:stop].to(cand.device).float() @ cand.T
        target = text_image[start:stop]
        true = scores.gather(1, target.unsqueeze(1))
        higher = (scores > true).sum(dim=1)
        ties_before = ((scores == true) & (col.unsqueeze(0) < target.unsqueeze(1))).sum(dim=1)
        ranks[start:stop] = (higher + ties_before).cpu()
    return ranks


def image_to_text_ranks(images: Tensor, texts: Tensor, text_image: Tensor, chunk_size: int = 1024,
                        offset: int = 0) -> Tensor:
    """0-based rank, among all texts, of the best-ranked of each image's captions.

    Args:
        images: [Q, E] query images; image q is global image ``offset + q``.
        texts: [T, E] all captions; ``text_image[t]`` is caption t's global image index.
    Returns:
        LongTensor [Q] on the CPU; an image without any caption is an error.
    """
    _check_pair(images, texts)
    cand = texts.float()
    owner = text_image.long().to(cand.device)
    if owner.numel() != cand.shape[0]:
        raise ValueError(f"text_image has {owner.numel()} entries for {cand.shape[0]} texts")
    col = torch.arange(cand.shape[0], device=cand.device)
    ranks = torch.empty(images.shape[0], dtype=torch.long)
    for start in range(0, images.shape[0], chunk_size):
        stop = min(start + chunk_size, images.shape[0])
        scores = images[start:stop].to(cand.device).float() @ cand.T  # [c, T]
        me = torch.arange(start, stop, device=cand.device) + offset
        pos = owner.unsqueeze(0) == me.unsqueeze(1)  # [c, T]
        if not bool(pos.any(dim=1).all()):
            q = int((~pos.any(dim=1)).nonzero()[0]) + start + offset
            raise ValueError(f"image {q} has no caption")
        best = scores.masked_fill(~pos, float("-inf")).max(dim=1, keepdim=True).values  # [c, 1]
        # first caption of the image reaching its best score: the lowest-ranked positive
        first = torch.where(pos & (scores == best), col.unsqueeze(0), cand.shape[0]).min(dim=1, keepdim=True).values
        higher = (scores > best).sum(dim=1)
        ties_before = ((scores == best) & (col.unsqueeze(0) < first)).sum(dim=1)
        ranks[start:stop] = (higher + ties_before).cpu()
    return ranks


def benchmark_metrics(i2t: Tensor, t2i: Tensor, ks: Sequence[int] = DEFAULT_KS) -> Dict[str, float]:
    """CLIP_benchmark's and OpenCLIP's names for 0-based ranks ``i2t`` [N images] (best caption)
    and ``t2i`` [T texts]: ``text_retrieval_recall@k`` (image->text), ``image_retrieval_recall@k``
    (text->image), ``image_to_text_mean_rank`` / ``_median_rank`` and ``text_to_image_*``
    (OpenCLIP: 1-based mean, and ``floor(median of 0-based ranks) + 1``)."""
    out: Dict[str, float] = {}
    for k in ks:
        out[f"image_retrieval_recall@{k}"] = float((t2i < k).double().mean())
        out[f"text_retrieval_recall@{k}"] = float((i2t < k).double().mean())
    for name, r in (("image_to_text", i2t), ("text_to_image", t2i)):
        out[f"{name}_mean_rank"] = float(r.double().mean()) + 1.0
        out[f"{name}_median_rank"] = float(math.floor(float(r.double().quantile(0.5)))) + 1.0
    return out


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
    out.update(benchmark_metrics(retrieval_ranks(image_features, text_features, chunk_size),
                                 retrieval_ranks(text_features, image_features, chunk_size), ks))
    out["n_pairs"] = float(image_features.shape[0])
    return out


@torch.no_grad()
def encode_pairs(model, batches: Iterable[Dict], sync: "RankSync", *, device: torch.device,
                 dtype: torch.dtype, max_samples: Optional[int] = None, tokenizer: Any = None,
                 multi_caption: bool = False) -> Tuple[Tensor, Tensor, Tensor]:
    """Features of this rank's images and captions: ``(img [n, E], txt [t, E], text_image [t])``,
    fp32 on ``device``; ``text_image`` holds each caption's image index among this rank's images.

    ``batches`` yield ``pixel_values`` [B,3,H,W], ``input_ids`` / ``attention_mask`` [B,L] (as
    ``pipeline.data.build.build_eval_loader`` does). With ``multi_caption`` (and a ``tokenizer``), the
    non-blank lines of each image's ``caption`` are tokenized and encoded as separate rows
    (one text forward per batch either way); otherwise one caption per image. All ranks run the
    same number of forwards (see :class:`eval.distributed.RankSync`); a rank stops taking data
    after ``max_samples`` images.
    """
    from infclip.pipeline.data.tokenizer import tokenize

    imgs: List[Tensor] = []
    txts: List[Tensor] = []
    owners: List[Tensor] = []
    n_img = 0
    idle = lambda: idle_forward(model, device, dtype, text=True)  # noqa: E731 (ZeRO-3 lockstep)
    for batch, take in sync.lockstep(batches, max_samples, idle):
        pv = batch["pixel_values"][:take].to(device=device, dtype=dtype)
        if multi_caption and "caption" in batch:
            if tokenizer is None:
                raise ValueError("several captions per image need the tokenizer")
            lists = [[line.strip() for line in c.splitlines() if line.strip()] or [c.strip()]
                     for c in batch["caption"][:take]]
            texts = [c for cs in lists for c in cs]
            owner = torch.tensor([n_img + i for i, cs in enumerate(lists) for _ in cs], dtype=torch.long)
            ids, mask = tokenize(tokenizer, texts, int(model.context_length))
            ids, mask = ids.to(device), mask.to(device)
        else:
            ids = batch["input_ids"][:take].to(device)
            mask = batch["attention_mask"][:take].to(device)
            owner = torch.arange(n_img, n_img + take, dtype=torch.long)
        imgs.append(image_features(model, pv))
        txts.append(text_features(model, ids, mask))
        owners.append(owner)
        n_img += take
    width = int(model.embed_dim)
    empty = torch.zeros(0, width, device=device)
    return ((torch.cat(imgs) if imgs else empty), (torch.cat(txts) if txts else empty),
            (torch.cat(owners) if owners else torch.zeros(0, dtype=torch.long)).to(device))


def retrieval_eval(model, batches: Iterable[Dict], sync: "RankSync", *, device: torch.device,
                   dtype: torch.dtype, max_samples: Optional[int] = None, chunk_size: int = 1024,
                   ks: Sequence[int] = DEFAULT_KS, tokenizer: Any = None,
                   multi_caption: bool = True) -> Dict[str, float]:
    """Encode the images and captions (split over ranks when ``sync.active``), gather every
    rank's features, rank this rank's queries against all candidates, and merge: every rank
    returns the metrics over all images and captions.

    Keys: ``i2t_r{k}``, ``i2t_median_rank``, ``t2i_*`` (the project's; i2t over images, t2i over
    captions), :func:`benchmark_metrics`' names, ``n_pairs`` (images) and ``n_texts``."""
    img, txt, owner = encode_pairs(model, batches, sync, device=device, dtype=dtype, max_samples=max_samples,
                                   tokenizer=tokenizer, multi_caption=multi_caption and tokenizer is not None)
    all_img, img_offset = sync.gather_rows(img)
    all_txt, txt_offset = sync.gather_rows(txt)
    all_owner, _ = sync.gather_rows(owner + img_offset)
    if all_img.shape[0] == 0:
        raise DataError("retrieval: the shards gave no image-text pair (do their samples have captions? the "
                        "loader skips a sample without one)")
    i2t = image_to_text_ranks(img, all_txt, all_owner, chunk_size, img_offset)
    t2i = text_to_image_ranks(txt, all_img, all_owner[txt_offset:txt_offset + txt.shape[0]], chunk_size)
    i2t, _ = sync.gather_rows(i2t.to(device))
    t2i, _ = sync.gather_rows(t2i.to(device))
    i2t, t2i = i2t.cpu(), t2i.cpu()
    out = ranks_to_metrics(i2t, "i2t", ks)
    out.update(ranks_to_metrics(t2i, "t2i", ks))
    out.update(benchmark_metrics(i2t, t2i, ks))
    out["n_pairs"] = float(all_img.shape[0])
    out["n_texts"] = float(all_txt.shape[0])
    return out
