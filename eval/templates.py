"""Prompt templates and class names for zero-shot classification, and the files they come from.

Design: a template is a plain string with exactly one ``{}`` placeholder, filled with
``str.replace`` (not ``str.format``) so that a template may contain other braces-free text and
class names with braces stay literal. Files are UTF-8, one entry per line; blank lines and lines
starting with ``#`` are skipped. :data:`DEFAULT_TEMPLATES` is a general photo-style set written
for this project (CLIP's recipe: many phrasings, embeddings averaged per class). Limit: one
placeholder per template; a template that needs the class name twice is not supported.
"""

from __future__ import annotations

from pathlib import Path
from typing import List, Sequence, Union

from infclip.ops.config import ConfigError

__all__ = [
    "DEFAULT_TEMPLATES",
    "check_templates",
    "fill_template",
    "load_classnames",
    "load_lines",
    "load_templates",
]

PLACEHOLDER = "{}"

DEFAULT_TEMPLATES: List[str] = [
    "a photo of a {}.",
    "a picture of a {}.",
    "an image of a {}.",
    "a photo of the {}.",
    "a close-up photo of a {}.",
    "a cropped photo of a {}.",
    "a blurry photo of a {}.",
    "a sharp photo of a {}.",
    "a bright photo of a {}.",
    "a dark photo of a {}.",
    "a low resolution photo of a {}.",
    "a high resolution photo of a {}.",
    "a pixelated photo of a {}.",
    "a black and white photo of a {}.",
    "a grayscale image of a {}.",
    "a small {}.",
    "a large {}.",
    "a photo of a small {}.",
    "a photo of a large {}.",
    "a drawing of a {}.",
    "a sketch of a {}.",
    "a painting of a {}.",
    "a cartoon {}.",
    "a rendering of a {}.",
    "a scan of a {}.",
    "a noisy image of a {}.",
    "a centered photo of a {}.",
    "a photo showing a {}.",
    "there is a {} in this picture.",
    "this is a {}.",
    "an example of a {}.",
    "a good photo of a {}.",
    "a bad photo of a {}.",
    "a snapshot of a {}.",
    "a {} in the picture.",
    "art of a {}.",
    "a doodle of a {}.",
    "a tattoo of a {}.",
    "an embroidered {}.",
    "a plastic {}.",
]
"""General-purpose zero-shot prompts; each contains ``{}`` once."""


def fill_template(template: str, classname: str) -> str:
    """``template`` with its ``{}`` replaced by ``classname``."""
    return template.replace(PLACEHOLDER, classname, 1)


def check_templates(templates: Sequence[str], source: str = "templates") -> List[str]:
    """Return ``templates`` as a list after checking it is non-empty and each has one ``{}``."""
    templates = list(templates)
    if not templates:
        raise ConfigError(f"{source}: no templates (the list is empty)")
    for i, t in enumerate(templates):
        if not isinstance(t, str):
            raise ConfigError(f"{source}: template {i} is not a string: {t!r}")
        count = t.count(PLACEHOLDER)
        if count != 1:
            raise ConfigError(f"{source}: template {i} {t!r} must contain '{{}}' exactly once "
                             f"(the class name goes there), found {count}")
    return templates


def load_lines(path: Union[str, Path], what: str) -> List[str]:
    """Non-blank, non-``#`` lines of a UTF-8 file, stripped; raises on a missing or empty file."""
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"{what} file not found: {path}")
    lines = [line.strip() for line in path.read_text(encoding="utf-8").splitlines()]
    lines = [line for line in lines if line and not line.startswith("#")]
    if not lines:
        raise ConfigError(f"{what} file {path} is empty (one entry per line expected)")
    return lines


def load_templates(path: Union[str, Path, None]) -> List[str]:
    """Templates from ``path`` (one per line, each with ``{}``), or the defaults when None."""
    if path is None:
        return list(DEFAULT_TEMPLATES)
    return check_templates(load_lines(path, "template"), source=str(path))


def load_classnames(path: Union[str, Path]) -> List[str]:
    """Class names from ``path``, one per line; duplicates are an error."""
    names = load_lines(path, "class-name")
    seen = set()
    for name in names:
        if name in seen:
            raise ConfigError(f"class-name file {path}: duplicate class name {name!r}")
        seen.add(name)
    return names
