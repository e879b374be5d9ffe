"""Offline and in-training evaluation: zero-shot classification and image-text retrieval.

Imports point one way: ``eval`` uses ``pipeline`` (model, data, tokenizer) and ``ops.config``;
``pipeline`` never imports ``eval`` (``launch/pretrain.py`` hands :func:`build_evaluator`'s
result to ``pipeline.train.train.train``).
"""

from .clip_benchmark import clip_benchmark_section
from .checkpoint import (LoadedModel, consolidate_fp32_state_dict, export_hf, export_openclip, find_tag_dir, load_model,
                         load_state_dict_strict)
from .config import EvalConfig
from .evaluator import Evaluator, build_evaluator
from .report import format_table, save_confusion_png, scalar_metrics, write_report
from .retrieval import retrieval_eval, retrieval_metrics, retrieval_ranks
from .templates import DEFAULT_TEMPLATES, load_classnames, load_templates
from .zeroshot import ZeroShotCounts, build_classifier, image_folder_samples, zeroshot_eval

__all__ = [
    "DEFAULT_TEMPLATES",
    "EvalConfig",
    "Evaluator",
    "LoadedModel",
    "ZeroShotCounts",
    "build_classifier",
    "build_evaluator",
    "clip_benchmark_section",
    "consolidate_fp32_state_dict",
    "export_hf",
    "export_openclip",
    "find_tag_dir",
    "format_table",
    "image_folder_samples",
    "load_classnames",
    "load_model",
    "load_state_dict_strict",
    "load_templates",
    "retrieval_eval",
    "retrieval_metrics",
    "retrieval_ranks",
    "save_confusion_png",
    "scalar_metrics",
    "write_report",
    "zeroshot_eval",
]
