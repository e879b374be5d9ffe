"""CLIP_benchmark's webdataset eval sets, read as they are published (``wds_imagenet1k``,
``wds_mscoco_captions``, ...).

Layout: ``<root>/<split>/*.tar`` shards whose samples hold an image (``webp``/``jpg``/``png``)
and either a ``.cls`` member (the class index as text: classification) or a ``.txt`` member with
one caption per line (retrieval, several captions per image); classification sets also have
``<root>/classnames.txt`` (one class name per line) and
``<root>/zeroshot_classification_templates.txt`` (one template per line with ``{c}``).

Design: :func:`clip_benchmark_section` turns such a folder into entries of the ``eval`` section
(``shards`` + ``classnames`` + ``templates`` for classification, ``retrieval_shards`` for
retrieval), so the one :class:`eval.evaluator.Evaluator` path runs both; the templates' ``{c}``
becomes the project's ``{}``. A folder with ``classnames.txt`` is a classification set, one
without a retrieval set.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Dict, List, Union

from .templates import check_templates, load_classnames, load_lines

__all__ = ["CLASSNAMES_FILE", "TEMPLATES_FILE", "clip_benchmark_section", "clip_benchmark_shards"]

CLASSNAMES_FILE = "classnames.txt"
TEMPLATES_FILE = "zeroshot_classification_templates.txt"


def clip_benchmark_shards(root: Union[str, Path], split: str = "test") -> List[str]:
    """The sorted ``<root>/<split>/*.tar`` paths; an error names the folder when there are none."""
    folder = Path(root) / split
    if not folder.is_dir():
        raise FileNotFoundError(f"CLIP_benchmark dataset folder {root} has no '{split}/' sub-folder "
                                f"(expected {folder}/*.tar)")
    shards = sorted(str(p) for p in folder.glob("*.tar"))
    if not shards:
        raise FileNotFoundError(f"no .tar shards in {folder}")
    return shards


def load_clip_benchmark_templates(path: Union[str, Path]) -> List[str]:
    """Templates of a CLIP_benchmark file (one per line, ``{c}`` for the class name) as the
    project's ``{}`` templates."""
    lines = load_lines(path, "template")
    return check_templates([t.replace("{c}", "{}") for t in lines], source=str(path))


def clip_benchmark_section(root: Union[str, Path], split: str = "test") -> Dict[str, Any]:
    """``eval``-section entries for a CLIP_benchmark webdataset folder.

    Returns ``{"shards": [...], "classnames": [...], "templates": [...]}`` for a classification
    set (``classnames.txt`` present; templates from ``zeroshot_classification_templates.txt``
    when present, else the defaults are left to the caller) or ``{"retrieval_shards": [...]}``
    for a retrieval set.
    """
    root = Path(root)
    if not root.is_dir():
        raise FileNotFoundError(f"CLIP_benchmark dataset folder not found: {root}")
    shards = clip_benchmark_shards(root, split)
    if not (root / CLASSNAMES_FILE).is_file():
        return {"retrieval_shards": shards}
    section: Dict[str, Any] = {"shards": shards, "classnames": load_classnames(root / CLASSNAMES_FILE)}
    if (root / TEMPLATES_FILE).is_file():
        section["templates"] = load_clip_benchmark_templates(root / TEMPLATES_FILE)
    return section
