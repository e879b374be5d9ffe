"""The evaluator: zero-shot classification and retrieval of a model, in training or offline.

Design: :class:`Evaluator` holds everything resolved from the ``eval`` section once (class
names, templates, data sources, preprocessing, where reports go) and is called as
``evaluator(model, step) -> {"zeroshot/top1": ..., "retrieval/i2t_r1": ...}``, the contract of
``pipeline.train.train.train`` (called on every rank, the unwrapped module in eval mode under
no_grad; the loop logs the values to TensorBoard). Each call writes ``<out_dir>/eval_step<N>.json``
and the confusion PNG from rank 0 and logs the table. The tokenizer may be given or loaded on
the first call from a folder, because a training run creates its tokenizer only once it starts.

Limit: the model must be a ``pipeline.model.model.CLIPTowers`` (called through ``forward`` with
``pixel_values`` or ``input_ids``; ``image_size``, ``context_length``, ``embed_dim``); a DeepSpeed
engine is unwrapped to its ``module``.
"""

from __future__ import annotations

import logging
import os
import time
from pathlib import Path
from typing import Any, Dict, List, Mapping, Optional, Sequence, Union

import torch

from infclip.ops.config import ConfigError
from infclip.pipeline.data.config import CLIP_MEAN, CLIP_STD

from .config import EvalConfig
from .distributed import RankSync
from .report import format_table, save_confusion_png, scalar_metrics, write_report
from .retrieval import retrieval_eval
from .zeroshot import ImageFolderData, build_classifier, image_folder_samples, zeroshot_eval

__all__ = ["Evaluator", "build_evaluator"]

logger = logging.getLogger(__name__)



class Evaluator:
    """Zero-shot classification and/or retrieval as ``cfg`` says.

    Args:
        cfg: the parsed ``eval`` section.
        tokenizer: a HF tokenizer, or None to load ``tokenizer_dir`` on the first call.
        tokenizer_dir: folder of the tokenizer (a run's ``<output_dir>/tokenizer``).
        image_mean, image_std: normalisation of the training data (``data`` section).
        image_key, caption_key: shard member extensions (``data`` section).
        out_dir: where reports go (None: no files, metrics only).
        workers: DataLoader workers for the eval data.
        shards, classnames: zero-shot shards and class names that replace the config's (for
            ``use_val_shards``: the data section's val shards).
    """

    def __init__(self, cfg: EvalConfig, *, tokenizer: Any = None, tokenizer_dir: Optional[str] = None,
                 image_mean: Sequence[float] = CLIP_MEAN, image_std: Sequence[float] = CLIP_STD,
                 image_key: str = "jpg;png;webp;jpeg", caption_key: str = "txt",
                 out_dir: Optional[str] = None, workers: int = 0,
                 shards: Optional[Union[str, List[str]]] = None, classnames: Optional[Sequence[str]] = None) -> None:
        from infclip.pipeline.data.shard_urls import check_shards_exist, expand_urls

        if not cfg.enabled:
            raise ConfigError("the eval section names no data: set 'shards' or 'images' (zero-shot) "
                             "and/or 'retrieval_shards'")
        if tokenizer is None and tokenizer_dir is None:
            raise ConfigError("Evaluator needs a tokenizer or a tokenizer folder")
        self.cfg = cfg
        self.every = cfg.every
        self.at_end = cfg.at_end
        self._tokenizer = tokenizer
        self.tokenizer_dir = tokenizer_dir
        self.image_mean, self.image_std = list(image_mean), list(image_std)
        self.image_key, self.caption_key = image_key, caption_key
        self.out_dir = out_dir
        self.workers = workers
        self.classnames: List[str] = []
        self.templates: List[str] = []
        self.folder_samples = None
        self.shards = shards if shards is not None else cfg.shards
        if cfg.has_zeroshot:
            if classnames is not None:
                self.classnames = list(classnames)
            elif cfg.classnames:
                self.classnames = cfg.resolved_classnames()
            else:
                raise ConfigError("zero-shot evaluation needs 'eval.classnames' (a file or a list)")
            self.templates = cfg.resolved_templates()
            if cfg.images:
                self.folder_samples = image_folder_samples(cfg.images, self.classnames)
            elif not self.shards:
                raise ConfigError("zero-shot evaluation has no shards ('use_val_shards' without "
                                  "'data.val_shards'?)")
            else:
                check_shards_exist(expand_urls(self.shards), "zero-shot eval shard")
        if cfg.has_retrieval:
            check_shards_exist(expand_urls(cfg.retrieval_shards), "retrieval shard")
        self.last_report: Optional[Dict[str, Any]] = None
        self.log_table = True
        """Log the report table from rank 0 after each evaluation."""

    @property
    def tokenizer(self):
        if self._tokenizer is None:
            from infclip.pipeline.data.tokenizer import load_tokenizer

            self._tokenizer = load_tokenizer(self.tokenizer_dir)
        return self._tokenizer

    def __call__(self, model, step: Optional[int] = None) -> Dict[str, float]:
        """Evaluate and return the scalar metrics (``zeroshot/top1``, ``retrieval/i2t_r1``, ...)."""
        return scalar_metrics(self.evaluate(model, step))

    def evaluate(self, model, step: Optional[int] = None, report_path: Optional[str] = None,
                 extra: Optional[Mapping[str, Any]] = None) -> Dict[str, Any]:
        """The full report: ``{"step", "zeroshot": {...}, "retrieval": {...}, "seconds"}``.

        Every rank must call this (collectives inside when the process group has several ranks);
        rank 0 writes ``report_path`` (default ``<out_dir>/eval_step<step>.json``) and the PNG.
        ``extra`` entries (e.g. the checkpoint path) are added to the report.
        """
        module = model.module if hasattr(model, "module") and hasattr(model.module, "encode_image") else model
        param = next(module.parameters())
        device, dtype = param.device, param.dtype
        sync = RankSync(split=self.cfg.distributed == "sharded", device=device)
        was_training = module.training
        module.eval()
        t0 = time.perf_counter()
        report: Dict[str, Any] = {"step": step, **dict(extra or {})}
        try:
            with torch.no_grad():
                if self.cfg.has_zeroshot:
                    report["zeroshot"], confusion = self._zeroshot(module, sync, device, dtype)
                if self.cfg.has_retrieval:
                    report["retrieval"] = self._retrieval(module, sync, device, dtype)
        finally:
            module.train(was_training)
        report["seconds"] = time.perf_counter() - t0
        is_main = not (torch.distributed.is_available() and torch.distributed.is_initialized()) \
            or torch.distributed.get_rank() == 0
        if is_main:
            path = report_path or (os.path.join(self.out_dir, f"eval_step{step}.json")
                                   if self.out_dir and step is not None else
                                   os.path.join(self.out_dir, "eval.json") if self.out_dir else None)
            if path is not None:
                if self.cfg.has_zeroshot and self.cfg.confusion_png:
                    png = str(Path(path).with_suffix("")) + "_confusion.png"
                    report["zeroshot"]["confusion_png"] = save_confusion_png(
                        confusion, self.classnames, png,
                        title=f"zero-shot confusion{'' if step is None else f' at step {step}'}")
                report["report_path"] = write_report(report, path)
        if is_main and self.log_table:
            logger.info("eval%s:\n%s", "" if step is None else f" at step {step}", format_table(report))
        self.last_report = report
        return report

    # ------------------------------------------------------------------------------ parts
    def _zeroshot(self, model, sync: RankSync, device, dtype):
        from infclip.pipeline.data.build import build_eval_loader

        classifier = build_classifier(model, self.tokenizer, self.classnames, self.templates,
                                      int(model.context_length), self.cfg.batch_size, device)
        size = int(model.image_size)
        if self.folder_samples is not None:
            data = ImageFolderData(self.folder_samples, size, self.image_mean, self.image_std)
            batches = data.batches(self.cfg.batch_size, sync.rank, sync.world, self.workers)
        else:
            batches = build_eval_loader(self.shards, self.tokenizer, image_size=size,
                                        context_length=int(model.context_length), batch_size=self.cfg.batch_size,
                                        workers=self.workers, with_labels=True, image_key=self.image_key,
                                        caption_key=self.caption_key, image_mean=self.image_mean,
                                        image_std=self.image_std, rank=sync.rank, world_size=sync.world,
                                        require_caption=False)  # CLIP_benchmark's sets: image + .cls only
        counts = zeroshot_eval(model, classifier, batches, sync, device=device, dtype=dtype,
                               max_samples=sync.share(self.cfg.max_samples))
        metrics = counts.metrics(self.classnames)
        metrics["num_classes"] = len(self.classnames)
        metrics["num_templates"] = len(self.templates)
        metrics["confusion"] = counts.confusion.tolist()
        return metrics, counts.confusion

    def _retrieval(self, model, sync: RankSync, device, dtype) -> Dict[str, float]:
        from infclip.pipeline.data.build import build_eval_loader

        batches = build_eval_loader(self.cfg.retrieval_shards, self.tokenizer, image_size=int(model.image_size),
                                    context_length=int(model.context_length), batch_size=self.cfg.batch_size,
                                    workers=self.workers, with_labels=False, image_key=self.image_key,
                                    caption_key=self.caption_key, image_mean=self.image_mean,
                                    image_std=self.image_std, rank=sync.rank, world_size=sync.world)
        return retrieval_eval(model, batches, sync, device=device, dtype=dtype,
                              max_samples=sync.share(self.cfg.max_samples), chunk_size=self.cfg.retrieval_chunk,
                              tokenizer=self.tokenizer, multi_caption=True)


def build_evaluator(eval_section: Optional[Union[Mapping[str, Any], EvalConfig]], run_cfg: Any = None,
                    source: Optional[str] = None, *, tokenizer: Any = None) -> Optional[Evaluator]:
    """The periodic evaluator for a training run, or None when there is nothing to evaluate.

    Args:
        eval_section: the raw ``eval`` dict of the run's JSON (``RunConfig.eval``) or an
            :class:`EvalConfig`; None or a section naming no data gives None.
        run_cfg: ``pipeline.config.RunConfig``: the tokenizer folder (``data.tokenizer`` or
            ``<train.output_dir>/tokenizer``), image normalisation and member keys (``data``),
            and the report folder (``eval.out_dir`` or ``<train.output_dir>/eval``).
        source: the config file (for error messages).
        tokenizer: use this tokenizer instead of loading one.
    Returns:
        ``Evaluator`` (``callable(model, step) -> {name: float}``, with ``every`` and ``at_end``).
    """
    if eval_section is None:
        return None
    cfg = eval_section if isinstance(eval_section, EvalConfig) else EvalConfig.from_dict(eval_section, source)
    if not cfg.enabled:
        logger.info("eval section has no data ('shards', 'images', 'retrieval_shards'): no evaluation")
        return None
    kwargs: Dict[str, Any] = {}
    out_dir = cfg.out_dir
    tokenizer_dir = None
    if cfg.use_val_shards:
        if run_cfg is None or not run_cfg.data.val_shards:
            raise ConfigError(f"{source or 'config'}: 'eval.use_val_shards' is set but 'data.val_shards' is not")
        from infclip.pipeline.data.shard_urls import prepare_shards
        from infclip.pipeline.data.shards import DIGITS_CLASSNAMES

        kwargs["shards"] = prepare_shards(run_cfg.data, "val")  # writes the digits split if asked to
        if not cfg.classnames:
            if not run_cfg.data.generate_digits:
                raise ConfigError(f"{source or 'config'}: 'eval.use_val_shards' needs 'eval.classnames' "
                                  "(only the generated digits set has default class names)")
            kwargs["classnames"] = list(DIGITS_CLASSNAMES)
    if run_cfg is not None:
        data = run_cfg.data
        output_dir = run_cfg.train.output_dir
        tokenizer_dir = data.tokenizer or os.path.join(output_dir, "tokenizer")
        kwargs.update(image_mean=list(data.image_mean), image_std=list(data.image_std),
                      image_key=data.image_key, caption_key=data.caption_key)
        out_dir = out_dir or os.path.join(output_dir, "eval")
    return Evaluator(cfg, tokenizer=tokenizer, tokenizer_dir=tokenizer_dir, out_dir=out_dir, **kwargs)
