"""Zero-shot classification: class embeddings from prompt templates, top-1/top-5, per-class
accuracy and a confusion matrix, streamed over any number of images.

Design: each class embedding is the mean over templates of the L2-normalised text features of
``template.format(class)``, re-normalised (CLIP's prompt ensembling). Images are scored against
the [C, E] class matrix batch by batch; only counts are kept (a C x C confusion matrix and a
top-k hit count), so memory does not grow with the number of images and counts from several
ranks add up exactly (all-reduce of integers). Ties are broken deterministically: the predicted
class is the lowest index among the maxima, and the true class's rank counts the classes that
score strictly higher plus those that tie at a lower index.

Limit: single-label classification only (one integer label per image).
"""

from __future__ import annotations

import logging
from typing import Dict, List, Optional, Sequence

import torch
from torch import Tensor

from .templates import check_templates, fill_template

__all__ = ["ZeroShotCounts", "build_classifier", "true_class_rank"]

logger = logging.getLogger(__name__)


def true_class_rank(logits: Tensor, labels: Tensor) -> Tensor:
    """0-based rank of each row's true class with the index tie rule.

    Args:
        logits: [B, C] scores; labels: [B] ints in [0, C).
    Returns:
        LongTensor [B]: ``#{c: s_c > s_y} + #{c < y: s_c == s_y}``.
    """
    true = logits.gather(1, labels.long().unsqueeze(1))  # [B, 1]
    cls = torch.arange(logits.shape[1], device=logits.device).unsqueeze(0)
    higher = (logits > true).sum(dim=1)
    ties_before = ((logits == true) & (cls < labels.long().unsqueeze(1))).sum(dim=1)
    return higher + ties_before


class ZeroShotCounts:
    """Running counts for C-way classification.

    ``confusion[t, p]`` counts images of true class t predicted as p; ``topk_hits[k]`` counts
    images whose true class ranks < k. Merge ranks by summing :attr:`state` tensors.
    """

    def __init__(self, num_classes: int, ks: Sequence[int] = (1, 5)) -> None:
        if num_classes < 1:
            raise ValueError(f"num_classes must be >= 1, got {num_classes}")
        self.num_classes = num_classes
        self.ks = tuple(ks)
        self.confusion = torch.zeros(num_classes, num_classes, dtype=torch.long)
        self.topk_hits = torch.zeros(len(self.ks), dtype=torch.long)

    def update(self, logits: Tensor, labels: Tensor) -> None:
        """Add a batch: logits [B, C], labels [B] (ints in [0, C))."""
        if logits.ndim != 2 or logits.shape[1] != self.num_classes:
            raise ValueError(f"logits must be [B, {self.num_classes}], got {tuple(logits.shape)}")
        labels = labels.long().to(logits.device)
        if labels.numel() and (labels.min() < 0 or labels.max() >= self.num_classes):
            bad = labels[(labels < 0) | (labels >= self.num_classes)][0].item()
            raise ValueError(f"label {bad} is outside the {self.num_classes} class names; check the "
                             f"class-name list against the data's labels")
        preds = logits.argmax(dim=1)  # first maximum: lowest index on ties
        idx = (labels * self.num_classes + preds).cpu()
        self.confusion += torch.bincount(idx, minlength=self.num_classes ** 2).view(
            self.num_classes, self.num_classes)
        ranks = true_class_rank(logits, labels).cpu()
        for i, k in enumerate(self.ks):
            self.topk_hits[i] += int((ranks < k).sum())

    @property
    def state(self) -> Tensor:
        """All counts as one LongTensor [C*C + len(ks)] (for an all-reduce)."""
        return torch.cat([self.confusion.flatten(), self.topk_hits])

    def load_state(self, state: Tensor) -> None:
        c2 = self.num_classes ** 2
        self.confusion = state[:c2].view(self.num_classes, self.num_classes).clone().cpu()
        self.topk_hits = state[c2:].clone().cpu()

    @property
    def count(self) -> int:
        return int(self.confusion.sum())

    def metrics(self, classnames: Optional[Sequence[str]] = None) -> Dict[str, object]:
        """``{"top1", "top5", "mean_per_class", "n", "per_class": {name: acc | None}}``.

        ``top{k}`` for every k in ``ks`` (k >= C counts every image as a hit). A class with no
        images has accuracy None and is left out of ``mean_per_class``.
        """
        n = self.count
        if n == 0:
            raise ValueError("no images were evaluated")
        out: Dict[str, object] = {f"top{k}": float(self.topk_hits[i]) / n for i, k in enumerate(self.ks)}
        support = self.confusion.sum(dim=1)
        correct = self.confusion.diagonal()
        names = list(classnames) if classnames is not None else [str(i) for i in range(self.num_classes)]
        per_class = {}
        accs = []
        for c, name in enumerate(names):
            if support[c] == 0:
                per_class[name] = None
            else:
                acc = float(correct[c]) / float(support[c])
                per_class[name] = acc
                accs.append(acc)
        out["mean_per_class"] = sum(accs) / len(accs)
        out["n"] = n
        out["per_class"] = per_class
        return out


@torch.no_grad()
def build_classifier(model, tokenizer, classnames: Sequence[str], templates: Sequence[str],
                     context_length: int, batch_size: int = 256,
                     device: Optional[torch.device] = None) -> Tensor:
    """Class embeddings [C, E] (fp32, unit rows) from prompt ensembling.

    Args:
        model: has ``encode_text(input_ids [B,L], attention_mask [B,L]) -> [B,E]``.
        tokenizer: a HF tokenizer; texts are tokenized with ``pipeline.tokenizer.tokenize``.
        classnames: C names; templates: T strings with ``{}``.
    """
    from pipeline.tokenizer import tokenize

    templates = check_templates(templates)
    if not classnames:
        raise ValueError("no class names")
    texts: List[str] = [fill_template(t, name) for name in classnames for t in templates]
    feats = []
    for start in range(0, len(texts), batch_size):
        ids, mask = tokenize(tokenizer, texts[start:start + batch_size], context_length)
        if device is not None:
            ids, mask = ids.to(device), mask.to(device)
        feats.append(model.encode_text(ids, mask).float())
    emb = torch.cat(feats).view(len(classnames), len(templates), -1)
    emb = torch.nn.functional.normalize(emb, dim=-1).mean(dim=1)
    return torch.nn.functional.normalize(emb, dim=-1)
