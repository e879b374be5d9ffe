"""The ``eval`` config section: what to evaluate, how often, and how ranks share the work.

Design: one dataclass parsed strictly by ``ops.config.parse_section`` (unknown keys are errors
naming the key and file). Zero-shot data is either labelled webdataset shards (``shards``, the
json member holding the integer class index under ``label``, in ``classnames`` order) or an image folder with one
sub-folder per class (``images``); retrieval takes paired shards (``retrieval_shards``). Class
names and templates are a file path (one per line) or an inline list; templates default to
:data:`eval.templates.DEFAULT_TEMPLATES`. Relative paths are taken as given (relative to the
working directory), as DeepSpeed does for its own paths.
"""

from __future__ import annotations

import dataclasses
from typing import Any, List, Literal, Mapping, Optional, Union

from infclip.ops.config import ConfigError, parse_section, require_at_least

from .templates import check_templates, load_classnames, load_templates

__all__ = ["EvalConfig"]


@dataclasses.dataclass
class EvalConfig:
    """The ``eval`` section (periodic evaluation during training, and offline defaults)."""

    every: int = 0
    """Evaluate every this many optimizer steps during training (0: never periodically)."""
    at_end: bool = True
    """Also evaluate once after the last training step."""
    shards: Optional[Union[str, List[str]]] = None
    """Zero-shot data: brace URL (or list of paths) of labelled webdataset shards (json member
    ``{"label": index}``, or CLIP_benchmark's ``.cls`` member holding the index as text)."""
    use_val_shards: bool = False
    """Zero-shot data: the ``data`` section's ``val_shards`` (written with the held-out digits
    split when ``data.generate_digits``; class names then default to the ten digit names).
    Exclusive with ``shards`` and ``images``."""
    images: Optional[str] = None
    """Zero-shot data: an image folder with one sub-folder per class (sub-folder name = class
    name; must match ``classnames``). Exclusive with ``shards``."""
    classnames: Optional[Union[str, List[str]]] = None
    """Class names: a file (one per line) or a list. Required for zero-shot."""
    templates: Optional[Union[str, List[str]]] = None
    """Prompt templates with ``{}``: a file (one per line) or a list; null: the default set."""
    retrieval_shards: Optional[Union[str, List[str]]] = None
    """Brace URL (or list of paths) of held-out image-text shards for R@1/5/10; a caption of
    several lines is several captions of the image (CLIP_benchmark's layout)."""
    batch_size: int = 256
    """Images (or captions) per forward pass."""
    max_samples: Optional[int] = None
    """Evaluate at most this many samples of each data set (null: all)."""
    retrieval_chunk: int = 1024
    """Queries per similarity block in retrieval (memory: chunk x N scores)."""
    distributed: Literal["sharded", "replicated"] = "sharded"
    """With several ranks: ``sharded`` splits the samples over ranks and adds the counts up;
    ``replicated`` has every rank evaluate everything (slower, no split). Every rank takes part
    either way (a ZeRO-3 forward needs all ranks); rank 0 writes the report."""
    out_dir: Optional[str] = None
    """Where periodic reports (JSON, confusion PNG) go (null: ``<train.output_dir>/eval``)."""
    confusion_png: bool = True
    """Draw the confusion matrix as a PNG beside the JSON report."""

    def __post_init__(self) -> None:
        require_at_least(self, 0, "every")
        require_at_least(self, 1, "batch_size", "retrieval_chunk")
        if self.max_samples is not None and self.max_samples < 1:
            raise ConfigError(f"'max_samples' must be >= 1 or null, got {self.max_samples}")
        if sum(map(bool, (self.shards, self.images, self.use_val_shards))) > 1:
            raise ConfigError("'shards', 'images' and 'use_val_shards' are exclusive: give one zero-shot "
                              "data source")
        if (self.shards or self.images) and not self.classnames:
            raise ConfigError("zero-shot data is given ('shards' or 'images') but 'classnames' is not")
        if isinstance(self.templates, list):
            try:
                check_templates(self.templates, source="'templates'")
            except ValueError as exc:
                raise ConfigError(str(exc)) from None
        if isinstance(self.classnames, list) and not self.classnames:
            raise ConfigError("'classnames' is an empty list")

    @classmethod
    def from_dict(cls, data: Optional[Mapping[str, Any]], source: Optional[str] = None) -> "EvalConfig":
        return parse_section(cls, data, "eval", source)

    @property
    def has_zeroshot(self) -> bool:
        return bool(self.shards or self.images or self.use_val_shards)

    @property
    def has_retrieval(self) -> bool:
        return bool(self.retrieval_shards)

    @property
    def enabled(self) -> bool:
        return self.has_zeroshot or self.has_retrieval

    def resolved_classnames(self) -> List[str]:
        """The class names (read from the file when a path was given)."""
        if self.classnames is None:
            raise ConfigError("'eval.classnames' is not set")
        if isinstance(self.classnames, list):
            return list(self.classnames)
        return load_classnames(self.classnames)

    def resolved_templates(self) -> List[str]:
        """The templates (the file's, the inline list, or the defaults)."""
        if isinstance(self.templates, list):
            return check_templates(self.templates, source="'eval.templates'")
        return load_templates(self.templates)
