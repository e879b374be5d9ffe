"""The model inside its DeepSpeed engine, with what the training step needs to call it.

Design: :func:`build_engine` builds the CLIP towers from the ``model`` section (identical init on
every rank; partitioned at construction under ZeRO-3 with ``model.zero3_init``), hands them to
``deepspeed.initialize`` with the user's DeepSpeed keys unchanged (weight decay off for 1-D
parameters unless ``train.weight_decay_1d``), and wraps the contrastive loss over DeepSpeed's
data-parallel group. The ZeRO-1/2 optimizer step is kept free of host waits
(:mod:`pipeline.engine.zero_step`), ZeRO-3's step does less Python (:mod:`pipeline.engine.zero3_step`).
DeepSpeed rejects a bad key inside its own sections with a pydantic error several screens long;
it is turned into one :class:`~ops.config.ConfigError` naming the file.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import logging
import os
import traceback
from typing import Any, Callable, Optional

import torch
import torch.distributed as dist

from infclip.ops import ContrastiveLoss
from infclip.ops.config import ConfigError

from ..config import RunConfig
from ..model.model import CLIPTowers
from ..model.param_layout import mark_zero3_leaf_layers, misaligned_parameters, param_groups
from .dist import barrier, world
from .tower_unit import reduce_when_accumulated
from .zero3_step import lighten_zero3
from .zero_step import keep_step_on_device

__all__ = ["TrainEngine", "build_engine", "contrastive_batch", "export_final", "param_groups"]

ZERO3_KEPT_WAITS = ("fetch", "norm")
"""DeepSpeed's ZeRO-3 host waits the training engine keeps, unless the towers are flat
(:func:`zero3_kept_waits`). Removing them (pipeline.engine.zero3_step, exact) measured no faster on one
H200 with flat blocks (ViT-B/32, micro-batch 256, one process: 3,436-3,460 samples/s without them
against 3,841 with them): that step is bound by the host's own per-step
work. ``()`` removes them."""


def zero3_kept_waits(model_cfg: Any) -> tuple:
    """The ZeRO-3 host waits to keep: none with flat towers (``model.flat_parameters: "tower"``),
    whose step leaves the host little else to do, so that it runs ahead of the GPU once the waits
    are gone (ViT-B/32, micro-batch 256, one H200, against ZeRO-2 with flat towers in the same
    process: 0.88-0.95x without them over nine processes, median 0.93x; 0.78-0.83x with them);
    else :data:`ZERO3_KEPT_WAITS`."""
    return () if model_cfg.flat_parameters == "tower" else ZERO3_KEPT_WAITS

logger = logging.getLogger(__name__)


@dataclasses.dataclass
class TrainEngine:
    """A DeepSpeed engine and how the loop feeds it."""

    engine: Any
    """``deepspeed.DeepSpeedEngine`` wrapping :class:`~pipeline.model.model.CLIPTowers`."""
    loss_fn: Callable
    """``loss_fn(img, txt, scale, bias) -> loss`` over the data-parallel group."""
    image_size: int
    context_length: int
    input_dtype: torch.dtype
    """dtype of ``pixel_values`` (DeepSpeed's bf16/fp16 parameter dtype)."""
    dp_group: Any
    dp_rank: int
    dp_world: int
    loss_kind: str = "clip"
    """``contrastive_loss.loss``: ``"clip"`` or ``"siglip"``."""
    contrastive_batch: int = 0
    """Rows one contrastive loss spans (its B, 0: unknown): the micro-batch times the data-parallel
    world under a distributed scheme (gather, disco, ring, ...: the loss of the global batch), the
    micro-batch alone with ``distributed: "none"`` (each rank its own loss)."""

    @property
    def device(self) -> torch.device:
        return self.engine.device


class _SchedulerStartFilter(logging.Filter):
    """Drops DeepSpeed's "Attempting to get learning rate from scheduler before it has started":
    its own warm-up schedulers log it from their constructors (the first ``step(-1)`` asks for the
    rate), so every run printed it while nothing was wrong."""

    def filter(self, record: logging.LogRecord) -> bool:
        return "before it has started" not in record.getMessage()


@contextlib.contextmanager
def _quiet_scheduler_start():
    from deepspeed.utils import logger as ds_logger

    quiet = _SchedulerStartFilter()
    ds_logger.addFilter(quiet)
    try:
        yield
    finally:
        ds_logger.removeFilter(quiet)


def _initialize(model: torch.nn.Module, groups: list, ds_config: dict, source: str):
    import deepspeed

    errors: tuple = ()
    try:
        import pydantic
        errors += (pydantic.ValidationError,)
    except ImportError:  # pragma: no cover - DeepSpeed depends on pydantic
        pass
    try:
        from deepspeed.runtime.config import DeepSpeedConfigError
        errors += (DeepSpeedConfigError,)
    except ImportError:  # pragma: no cover
        pass
    try:
        with _quiet_scheduler_start():
            engine, _, _, _ = deepspeed.initialize(model=model, model_parameters=groups, config=ds_config)
    except (*errors, TypeError, ValueError, AssertionError) as exc:
        section = None if isinstance(exc, errors) else _section_at_fault(exc)
        if section in ("optimizer", "scheduler"):
            kind = (ds_config.get(section) or {}).get("type")
            first = (str(exc).strip().splitlines() or [type(exc).__name__])[0][:300]
            raise ConfigError(f"{source}: DeepSpeed could not build the {section} '{kind}' from the '{section}' "
                              f"section (check '{section}.type' and the names and values in '{section}.params'): "
                              f"{first}") from None
        # DeepSpeed checks batch-size arithmetic and similar with asserts in its config module and
        # its engine's sanity check; an assert anywhere else is a bug and keeps its traceback
        if not isinstance(exc, errors) and section != "config":
            raise
        lines = [ln.strip() for ln in str(exc).splitlines() if ln.strip() and not ln.strip().startswith("For further")]
        raise ConfigError(f"{source}: DeepSpeed rejected the config: {'; '.join(lines[:4])[:600]}") from None
    return engine


#: Where DeepSpeed turns its config into objects: a TypeError, ValueError or assert raised under
#: these (``learning_rate`` for ``lr``, ``"betas": 0.9``, an unknown optimizer type or scheduler
#: keyword, batch sizes that do not multiply out) is the config's fault, not a bug of ours.
_BUILDERS = {"_configure_basic_optimizer": "optimizer", "_scheduler_from_config": "scheduler",
             "_do_sanity_check": "config"}


def _section_at_fault(exc: BaseException) -> Optional[str]:
    """``"optimizer"``, ``"scheduler"`` or ``"config"`` when ``exc`` was raised while DeepSpeed
    built that part from the config; None otherwise."""
    for frame in reversed(traceback.extract_tb(exc.__traceback__)):
        if frame.name in _BUILDERS and frame.filename.endswith(os.path.join("deepspeed", "runtime", "engine.py")):
            return _BUILDERS[frame.name]
    frames = traceback.extract_tb(exc.__traceback__)
    if isinstance(exc, AssertionError) and frames and frames[-1].filename.endswith(
            os.path.join("deepspeed", "runtime", "config.py")):
        return "config"
    return None


def with_engine_defaults(ds_config: dict, compiled: bool) -> dict:
    """``ds_config`` as the engine gets it; a value the config sets is kept.

    * ``timers.throughput.enabled`` defaults to false: DeepSpeed's throughput timer (on by default,
      ``synchronized``) calls ``torch.cuda.synchronize()`` at the start of every forward and the
      end of every step, so the GPU's queue runs dry twice a step (the run's samples/s are
      measured by ``pipeline.train.metrics`` without a wait).
    * Under ZeRO-3 with compiled towers, ``zero_optimization.memory_efficient_linear`` defaults to
      false: DeepSpeed's replacement linear checks each weight's ``ds_id`` in its backward, and
      torch.compile guards on that integer, so every block compiled a graph of its own until
      dynamo's recompile limit and the rest ran eager (ZeRO-3 at 0.3x ZeRO-2 on an H200)."""
    out = dict(ds_config)
    timers = dict(out.get("timers") or {})
    if "throughput" not in timers:
        out["timers"] = {**timers, "throughput": {"enabled": False}}
    zero = dict(out.get("zero_optimization", {}))
    if compiled and zero.get("stage") == 3 and "memory_efficient_linear" not in zero:
        out["zero_optimization"] = {**zero, "memory_efficient_linear": False}
    return out


def build_engine(run_cfg: RunConfig, tokenizer: Any) -> TrainEngine:
    """Towers -> ``deepspeed.initialize`` -> :class:`TrainEngine` (the process group is up)."""
    import deepspeed

    model_cfg, tcfg = run_cfg.model, run_cfg.train
    ds_config = dict(run_cfg.ds_config)
    if "optimizer" not in ds_config:
        raise ConfigError(f"{run_cfg.source}: an 'optimizer' section is required (DeepSpeed builds the optimizer)")
    torch.manual_seed(tcfg.seed)  # identical init on every rank
    zero3 = run_cfg.zero_stage == 3
    model = CLIPTowers.from_config(model_cfg, tokenizer,
                                   zero3_config=ds_config if zero3 and model_cfg.zero3_init else None)
    model.lock_towers()  # LiT: frozen parameters get requires_grad=False and stay out of param_groups
    image_size, context_length = model_cfg.vision.image_size, model_cfg.text.context_length
    if model_cfg.pretrained:
        image_size, context_length = model.image_size, model.context_length
    if zero3 and model_cfg.zero3_leaf_layers:
        mark_zero3_leaf_layers(model, model_cfg.zero3_leaf_layers)
    # DeepSpeed's `tensorboard` section only says where the run's one writer (pipeline.train.metrics)
    # writes: DeepSpeed's own monitor would log the same quantities again under other names
    engine_config = with_engine_defaults({k: v for k, v in ds_config.items() if k != "tensorboard"},
                                          model_cfg.compile is not False)
    engine = _initialize(model, param_groups(model, tcfg.weight_decay_1d), engine_config, str(run_cfg.source))
    keep_step_on_device(engine)  # ZeRO-1/2 with bf16: no host waits in the step; ZeRO-0: one overflow read
    if zero3:
        # less of DeepSpeed's per-step Python (pipeline.engine.zero3_step); its host waits kept but with flat towers
        lighten_zero3(engine, keep_waits=zero3_kept_waits(model_cfg))
        engine.module.bind_flat_views_in_forward()  # after DeepSpeed's hooks: views of the gathered tensors
        reduce_when_accumulated(engine)  # "tower" units: their gradients reduced once accumulated
    misaligned = misaligned_parameters(engine.module)
    if misaligned:
        logger.warning("%d parameters do not start on a 16-byte boundary (slow GEMM and elementwise kernels), "
                       "e.g. %s", len(misaligned), ", ".join(misaligned[:3]))
    if model_cfg.gradient_checkpointing and model_cfg.checkpointing_impl == "deepspeed":
        deepspeed.checkpointing.configure(None, deepspeed_config=ds_config)
        engine.module.set_gradient_checkpointing(True, deepspeed.checkpointing.checkpoint)
    multi = dist.is_available() and dist.is_initialized() and dist.get_world_size() > 1
    dp_group = engine.data_parallel_group if hasattr(engine, "data_parallel_group") else None
    criterion = ContrastiveLoss(run_cfg.contrastive_loss)
    siglip = run_cfg.contrastive_loss.loss == "siglip"

    def loss_fn(img, txt, scale, bias):
        return criterion(img, txt, scale, bias if siglip else None, process_group=dp_group)

    dp_world = dist.get_world_size(dp_group) if multi else 1
    return TrainEngine(engine=engine, loss_fn=loss_fn, image_size=image_size, context_length=context_length,
                       input_dtype=run_cfg.param_dtype, dp_group=dp_group,
                       dp_rank=dist.get_rank(dp_group) if multi else 0, dp_world=dp_world,
                       loss_kind=run_cfg.contrastive_loss.loss,
                       contrastive_batch=contrastive_batch(run_cfg.micro_batch_size, dp_world,
                                                           run_cfg.contrastive_loss.distributed))


def contrastive_batch(micro_batch: int, dp_world: int, distributed: str) -> int:
    """The B of one contrastive loss: every distributed scheme computes the loss of the global
    batch (``micro_batch`` x ``dp_world`` rows); ``"none"`` each rank's own micro-batch."""
    return micro_batch * (dp_world if distributed != "none" else 1)


def _gathered(engine: Any):
    """Context gathering ZeRO-3 partitioned parameters (all ranks must enter), else a no-op."""
    if engine.zero_optimization_stage() == 3:
        import deepspeed
        return deepspeed.zero.GatheredParameters(list(engine.module.parameters()), modifier_rank=None)
    return contextlib.nullcontext()


def export_final(engine: Any, tokenizer: Any, final_dir: str, image_mean: Any = None, image_std: Any = None) -> str:
    """Write ``final_dir`` from rank 0 (every rank must call: ZeRO-3 gathers the weights) with
    ``CLIPTowers.save_pretrained(final_dir, tokenizer, image_mean, image_std)``: a
    ``transformers.CLIPModel`` + ``CLIPProcessor`` folder, which the project loads back exactly
    (the raw logit scale in the config's ``infclip`` entry). Without ``image_mean`` /
    ``image_std`` they are read from the run's ``config.json`` beside ``final_dir`` (its ``data``
    section; CLIP's when unset). Returns ``final_dir``."""
    rank = world()[0]
    if rank == 0 and (image_mean is None or image_std is None):
        run_config = os.path.join(os.path.dirname(os.path.abspath(final_dir)), "config.json")
        try:
            with open(run_config) as f:
                data = json.load(f).get("data") or {}
        except (OSError, ValueError, AttributeError):
            data = {}
        image_mean = image_mean if image_mean is not None else data.get("image_mean")
        image_std = image_std if image_std is not None else data.get("image_std")
    with _gathered(engine):
        if rank == 0:
            engine.module.save_pretrained(final_dir, tokenizer=tokenizer, image_mean=image_mean, image_std=image_std)
    barrier()
    return final_dir
