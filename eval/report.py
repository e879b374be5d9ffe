"""Eval reports: a JSON file, a plain-text table, scalar tags for TensorBoard, and the confusion
matrix drawn as a PNG with PIL.

Design: one nested dict is the report (``{"zeroshot": {...}, "retrieval": {...}, ...}``); every
output is derived from it. The PNG is drawn with Pillow only (a project dependency), so no
matplotlib is needed: row-normalised cells shaded white->blue, counts printed when the cells are
big enough, class names on both axes. Limit: beyond ~100 classes the names are left off and the
picture is only a heat map.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any, Dict, Mapping, Optional, Sequence, Union

import torch

__all__ = ["format_table", "save_confusion_png", "scalar_metrics", "write_report"]


COUNT_KEYS = frozenset({"n", "n_pairs", "n_texts", "num_classes", "num_templates"})
#: CLIP_benchmark's names for values the report also holds under the project's own names
#: (acc1 = top1, image_retrieval_recall@k = t2i_r{k}, ...): in the JSON report and the printed
#: table, but written to TensorBoard once, under the project's name.
ALIAS_KEYS = frozenset({"acc1", "acc5", "mean_per_class_recall",
                        *(f"{d}_retrieval_recall@{k}" for d in ("image", "text") for k in (1, 5, 10))})
"""Report entries that describe the data rather than the model (left out of the TensorBoard tags)."""


def scalar_metrics(report: Mapping[str, Any], counts: bool = False, aliases: bool = False) -> Dict[str, float]:
    """Flat ``{"zeroshot/top1": ..., "retrieval/i2t_r1": ...}`` of every float/int leaf one level
    down (per-class dicts and the confusion matrix are left out; so are the sample counts unless
    ``counts``, and CLIP_benchmark's duplicate names, :data:`ALIAS_KEYS`, unless ``aliases``).
    These are the values the training loop writes to TensorBoard."""
    out: Dict[str, float] = {}
    for section, values in report.items():
        if not isinstance(values, Mapping):
            continue
        for key, value in values.items():
            if isinstance(value, bool) or not isinstance(value, (int, float)):
                continue
            if (key in COUNT_KEYS and not counts) or (key in ALIAS_KEYS and not aliases):
                continue
            out[f"{section}/{key}"] = float(value)
    return out


def write_report(report: Mapping[str, Any], path: Union[str, Path]) -> str:
    """Write ``report`` as indented JSON (atomically: temp file then rename); returns the path."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.tmp-{os.getpid()}")
    tmp.write_text(json.dumps(report, indent=2, sort_keys=False) + "\n", encoding="utf-8")
    os.replace(tmp, path)
    return str(path)


def _fmt(value: Any) -> str:
    if value is None:
        return "-"
    if isinstance(value, float):
        return f"{value:.4f}"
    return str(value)


def format_table(report: Mapping[str, Any], max_classes: int = 50) -> str:
    """A human-readable summary: one ``section/metric  value`` row per scalar, then per-class
    accuracy (the first ``max_classes`` classes) when present."""
    scalars = scalar_metrics(report, counts=True, aliases=True)
    lines = []
    if scalars:
        width = max(len(k) for k in scalars)
        lines.append(f"{'metric'.ljust(width)}  value")
        lines.append(f"{'-' * width}  ------")
        lines.extend(f"{k.ljust(width)}  {_fmt(v)}" for k, v in scalars.items())
    per_class = (report.get("zeroshot") or {}).get("per_class") if isinstance(report.get("zeroshot"), Mapping) else None
    if per_class:
        names = list(per_class)[:max_classes]
        width = max(len("class"), max(len(n) for n in names))
        lines.append("")
        lines.append(f"{'class'.ljust(width)}  accuracy")
        lines.append(f"{'-' * width}  --------")
        lines.extend(f"{n.ljust(width)}  {_fmt(per_class[n])}" for n in names)
        if len(per_class) > max_classes:
            lines.append(f"... ({len(per_class) - max_classes} more classes in the JSON report)")
    return "\n".join(lines)


def save_confusion_png(confusion: Union[torch.Tensor, Sequence[Sequence[int]]],
                       classnames: Optional[Sequence[str]], path: Union[str, Path],
                       title: str = "") -> str:
    """Draw a C x C confusion matrix (rows: true class, columns: predicted) as a PNG.

    Cells are shaded by the row-normalised fraction; counts are written inside cells of >= 18 px;
    class names label the axes for C <= 100. Returns the path written.
    """
    from PIL import Image, ImageDraw, ImageFont

    conf = torch.as_tensor(confusion, dtype=torch.long)
    if conf.ndim != 2 or conf.shape[0] != conf.shape[1]:
        raise ValueError(f"confusion matrix must be square [C, C], got {tuple(conf.shape)}")
    c = conf.shape[0]
    names = [str(n) for n in classnames] if classnames is not None else [str(i) for i in range(c)]
    font = ImageFont.load_default()
    cell = max(4, min(40, 800 // max(c, 1)))
    show_names = c <= 100
    label_w = (min(max(len(n) for n in names), 24) * 7 + 10) if show_names else 10
    top = 24 + (label_w if show_names else 10)
    left = label_w + 20
    width = left + c * cell + 10
    height = top + c * cell + 30
    img = Image.new("RGB", (width, height), "white")
    draw = ImageDraw.Draw(img)
    rows = conf.sum(dim=1, keepdim=True).clamp(min=1).double()
    frac = (conf.double() / rows).tolist()
    counts = conf.tolist()
    for t in range(c):
        for p in range(c):
            f = frac[t][p]
            shade = (int(255 - 225 * f), int(255 - 170 * f), 255)
            x0, y0 = left + p * cell, top + t * cell
            draw.rectangle([x0, y0, x0 + cell - 1, y0 + cell - 1], fill=shade, outline=(220, 220, 220))
            if cell >= 18 and counts[t][p]:
                colour = "white" if f > 0.55 else "black"
                draw.text((x0 + 2, y0 + cell // 2 - 5), str(counts[t][p]), fill=colour, font=font)
    if show_names:
        for i, name in enumerate(names):
            short = name[:24]
            draw.text((4, top + i * cell + max(cell // 2 - 5, 0)), short, fill="black", font=font)
            label = Image.new("RGBA", (label_w, 12), (255, 255, 255, 0))
            ImageDraw.Draw(label).text((0, 0), short, fill="black", font=font)
            rotated = label.rotate(90, expand=True)
            img.paste(rotated, (left + i * cell + max(cell // 2 - 6, 0), 20), rotated)
    draw.text((left, 4), title or "confusion (rows: true, columns: predicted)", fill="black", font=font)
    draw.text((left, top + c * cell + 8), f"{int(conf.sum())} images, {c} classes; "
              f"accuracy {float(conf.diagonal().sum()) / max(1, int(conf.sum())):.3f}", fill="black", font=font)
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    img.save(path, format="PNG")
    return str(path)

