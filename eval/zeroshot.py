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

import io
import logging
from pathlib import Path
from typing import TYPE_CHECKING, Dict, Iterable, Iterator, List, Optional, Sequence, Tuple, Union

import torch
from torch import Tensor

from infclip.ops.config import ConfigError
from infclip.pipeline.data.transforms import eval_pixels
from infclip.pipeline.errors import DataError

from .features import idle_forward, image_features, text_features
from .templates import check_templates, fill_template

if TYPE_CHECKING:
    from .distributed import RankSync

__all__ = ["IMAGE_SUFFIXES", "ImageFolderData", "ZeroShotCounts", "build_classifier", "image_folder_samples",
           "true_class_rank", "zeroshot_eval"]

IMAGE_SUFFIXES = (".jpg", ".jpeg", ".png", ".webp", ".bmp", ".gif", ".tif", ".tiff")

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
            raise DataError(f"label {bad} is outside the {self.num_classes} class names; check the "
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
        """``{"top1", "top5", "acc1", "acc5", "mean_per_class", "mean_per_class_recall", "n",
        "per_class": {name: acc | None}}`` (``acc{k}`` / ``mean_per_class_recall``: the same values
        under CLIP_benchmark's names).

        ``top{k}`` for every k in ``ks`` (k >= C counts every image as a hit). A class with no
        images has accuracy None and is left out of ``mean_per_class``.
        """
        n = self.count
        if n == 0:
            raise DataError("no images were evaluated (every one was skipped, or the data is empty)")
        out: Dict[str, object] = {f"top{k}": float(self.topk_hits[i]) / n for i, k in enumerate(self.ks)}
        out.update({f"acc{k}": float(self.topk_hits[i]) / n for i, k in enumerate(self.ks)})  # CLIP_benchmark's names
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
        out["mean_per_class_recall"] = out["mean_per_class"]  # CLIP_benchmark's name (balanced accuracy)
        out["n"] = n
        out["per_class"] = per_class
        return out


@torch.no_grad()
def build_classifier(model, tokenizer, classnames: Sequence[str], templates: Sequence[str],
                     context_length: int, batch_size: int = 256,
                     device: Optional[torch.device] = None) -> Tensor:
    """Class embeddings [C, E] (fp32, unit rows) from prompt ensembling.

    Args:
        model: ``pipeline.model.model.CLIPTowers`` (called as ``model(input_ids=, attention_mask=)``).
        tokenizer: a HF tokenizer; texts are tokenized with ``pipeline.data.tokenizer.tokenize``.
        classnames: C names; templates: T strings with ``{}``.
    """
    from infclip.pipeline.data.tokenizer import tokenize

    templates = check_templates(templates)
    if not classnames:
        raise ConfigError("no class names")
    texts: List[str] = [fill_template(t, name) for name in classnames for t in templates]
    feats = []
    for start in range(0, len(texts), batch_size):
        ids, mask = tokenize(tokenizer, texts[start:start + batch_size], context_length)
        if device is not None:
            ids, mask = ids.to(device), mask.to(device)
        feats.append(text_features(model, ids, mask))
    emb = torch.cat(feats).view(len(classnames), len(templates), -1)
    emb = torch.nn.functional.normalize(emb, dim=-1).mean(dim=1)
    return torch.nn.functional.normalize(emb, dim=-1)


# ----------------------------------------------------------------------------- image folders

def image_folder_samples(root: Union[str, Path], classnames: Sequence[str]) -> List[Tuple[Path, int]]:
    """``(image path, class index)`` for ``root/<classname>/*.<image>``, sorted by class then name.

    Every class name must have a sub-folder (a missing one is an error naming it); sub-folders
    that are not class names are ignored with a warning; a class folder may be empty.
    """
    root = Path(root)
    if not root.is_dir():
        raise FileNotFoundError(f"image folder not found: {root}")
    present = {p.name for p in root.iterdir() if p.is_dir()}
    missing = [name for name in classnames if name not in present]
    if missing:
        shown = ", ".join(repr(m) for m in missing[:10]) + (f" (+{len(missing) - 10} more)" if len(missing) > 10 else "")
        raise FileNotFoundError(f"missing class folder(s) in {root}: {shown}; each class name needs a "
                                f"sub-folder of that exact name (found: {sorted(present)[:10]})")
    extra = sorted(present - set(classnames))
    if extra:
        logger.warning("%s: %d sub-folder(s) are not class names and are ignored: %s", root, len(extra), extra[:10])
    samples = []
    for index, name in enumerate(classnames):
        files = sorted(p for p in (root / name).iterdir() if p.is_file() and p.suffix.lower() in IMAGE_SUFFIXES)
        samples.extend((p, index) for p in files)
    if not samples:
        raise DataError(f"no images ({', '.join(IMAGE_SUFFIXES)}) under the class folders of {root}")
    return samples


#: The label of an image that could not be read: :func:`zeroshot_eval` skips and counts it.
UNREADABLE = -2


class ImageFolderData(torch.utils.data.Dataset):
    """Images of a class-per-folder tree, preprocessed by the eval loader's own function
    (``pipeline.data.transforms.eval_pixels``). Items: ``(pixels [3,S,S], label)``; an image that cannot be
    read is named in a warning and given as zeros with label :data:`UNREADABLE`."""

    def __init__(self, samples: Sequence[Tuple[Path, int]], image_size: int, mean: Sequence[float],
                 std: Sequence[float]) -> None:
        self.samples = list(samples)
        self.image_size = image_size
        self.mean = torch.tensor(list(mean), dtype=torch.float32).view(3, 1, 1)
        self.std = torch.tensor(list(std), dtype=torch.float32).view(3, 1, 1)

    def __len__(self) -> int:
        return len(self.samples)

    def __getitem__(self, i: int) -> Tuple[Tensor, int]:
        from PIL import Image

        path, label = self.samples[i]
        try:
            with Image.open(io.BytesIO(path.read_bytes())) as img:
                return eval_pixels(img, self.image_size, self.mean, self.std), label
        except (OSError, ValueError, SyntaxError, Image.DecompressionBombError) as exc:
            logger.warning("skipping unreadable image %s: %s", path, str(exc)[:200])
            return torch.zeros(3, self.image_size, self.image_size), UNREADABLE

    def batches(self, batch_size: int, rank: int = 0, world: int = 1, workers: int = 0) -> Iterator[Dict[str, Tensor]]:
        """Batches ``{"pixel_values", "label"}`` of this rank's share (every ``world``-th image)."""
        subset = torch.utils.data.Subset(self, list(range(rank, len(self), world)))
        loader = torch.utils.data.DataLoader(subset, batch_size=batch_size, shuffle=False, num_workers=workers)
        for pixels, labels in loader:
            yield {"pixel_values": pixels, "label": labels}


# ------------------------------------------------------------------------------- the eval loop

@torch.no_grad()
def zeroshot_eval(model, classifier: Tensor, batches: Iterable[Dict], sync: "RankSync", *,
                  device: torch.device, dtype: torch.dtype, max_samples: Optional[int] = None,
                  ks: Sequence[int] = (1, 5)) -> ZeroShotCounts:
    """Classify this rank's images against ``classifier`` [C, E]; counts summed over ranks.

    ``batches`` yield ``pixel_values`` [B,3,H,W] and ``label`` [B] (ints; -1 = the sample had no
    label, an error; :data:`UNREADABLE`: the image could not be read, skipped and counted in a
    warning). Every rank runs the same number of image forwards (ZeRO-3 safe).
    """
    counts = ZeroShotCounts(classifier.shape[0], ks)
    weights = classifier.to(device=device, dtype=torch.float32)
    idle = lambda: idle_forward(model, device, dtype)  # noqa: E731 (ZeRO-3 lockstep)
    unreadable = 0
    for batch, take in sync.lockstep(batches, max_samples, idle):
        labels = batch["label"][:take]
        readable = labels != UNREADABLE  # the forward still takes every row: the ranks stay in lockstep
        unreadable += int((~readable).sum())
        if (labels[readable] < 0).any():
            key = batch.get("key", ["?"] * take)[int(((labels < 0) & readable).nonzero()[0])]
            raise DataError(f"sample {key!r} has no label: zero-shot shards need a json member "
                             "{\"label\": class index} or a .cls member (the index as text)")
        feats = image_features(model, batch["pixel_values"][:take].to(device=device, dtype=dtype))
        counts.update((feats @ weights.T)[readable.to(feats.device)], labels[readable].to(device))
    if unreadable:
        logger.warning("zero-shot: skipped %d unreadable image(s) of this rank (named above)", unreadable)
    state = sync.sum_(counts.state)
    counts.load_state(state)
    return counts
