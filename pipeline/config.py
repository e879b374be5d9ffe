"""One JSON file per run: DeepSpeed's own keys plus the project's sections, read once.

Design: :func:`load_config` reads the file, applies ``--set section.key=value`` overrides, checks
every TOP-LEVEL key against DeepSpeed's keys (listed once below) and the project's sections, and
parses the project sections into their dataclasses (``model``, ``data``, ``contrastive_loss``,
``train``). DeepSpeed's keys stay a plain dict for ``deepspeed.initialize`` (which validates its
own sections' contents, but ignores unknown top-level keys: this module is where a typo such
as ``zero_optimisation`` gets caught). ``eval`` stays a raw dict: ``pipeline`` never imports
``eval``; ``launch/`` parses it.

Limit: the DeepSpeed key list is the one of deepspeed 0.19.x (collected from
``deepspeed/runtime/config.py``, ``runtime/constants.py``, ``monitor/config.py``,
``comm/config.py`` and friends); a key added by a later DeepSpeed release must be added here.
"""

from __future__ import annotations

import copy
import dataclasses
import difflib
import json
import os
from typing import TYPE_CHECKING, Any, Iterable, Mapping, Optional

from ops.config import ConfigError, ContrastiveLossConfig

from .model import ModelConfig, ds_param_dtype
from .train import TrainConfig

if TYPE_CHECKING:
    import torch

__all__ = ["DEEPSPEED_TOP_LEVEL_KEYS", "PROJECT_SECTIONS", "RunConfig", "load_config",
           "apply_overrides", "check_top_level_keys"]

#: Top-level keys DeepSpeed 0.19 reads from its config (everything else it silently ignores).
DEEPSPEED_TOP_LEVEL_KEYS = frozenset({
    # batch and steps (runtime/config.py, runtime/constants.py)
    "train_batch_size", "train_micro_batch_size_per_gpu", "gradient_accumulation_steps",
    "managed_gradient_accumulation", "steps_per_print", "dump_state", "disable_python_gc",
    "disable_allgather", "dataloader_drop_last", "log_level", "vocabulary_size",
    # gradients and communication
    "gradient_clipping", "prescale_gradients", "gradient_predivide_factor", "gradient_allreduce_op",
    "communication_data_type", "seq_parallel_communication_data_type", "sparse_gradients_enabled",
    # optimizer and schedule
    "optimizer", "scheduler", "zero_allow_untested_optimizer", "zero_force_ds_cpu_optimizer",
    # precision
    "fp16", "bf16", "bfloat16", "torch_autocast", "data_types",
    # ZeRO, offload, checkpointing
    "zero_optimization", "aio", "activation_checkpointing", "checkpoint", "datastates_ckpt",
    # monitoring and profiling (monitor/config.py, comm/config.py, profiling/, utils/config.py)
    "tensorboard", "wandb", "csv_monitor", "comet", "comms_logger", "flops_profiler",
    "wall_clock_breakdown", "memory_breakdown", "timers", "autotuning", "model_info",
    # parallelism and other engines
    "pipeline", "tensor_parallel", "expert_parallel", "use_data_before_expert_parallelism",
    "sequence_parallel_size", "data_parallel_size", "hybrid_engine", "data_efficiency",
    "compile", "weight_quantization",
})

#: The project's own top-level sections.
PROJECT_SECTIONS = ("model", "data", "contrastive_loss", "train", "eval")


@dataclasses.dataclass
class RunConfig:
    """Everything a run needs, parsed once from one JSON file."""

    ds_config: dict
    """DeepSpeed's keys only, as written (handed to ``deepspeed.initialize``)."""
    model: ModelConfig
    data: Any
    """``pipeline.data.DataConfig``."""
    contrastive_loss: ContrastiveLossConfig
    train: TrainConfig
    eval: Optional[dict]
    """The raw ``eval`` section (None when absent); parsed by ``launch/``."""
    source: Optional[str] = None
    """The file it came from (for error messages)."""
    raw: dict = dataclasses.field(default_factory=dict)
    """The whole JSON after overrides (saved with checkpoints)."""

    @property
    def micro_batch_size(self) -> int:
        """``train_micro_batch_size_per_gpu`` from DeepSpeed's keys."""
        mb = self.ds_config.get("train_micro_batch_size_per_gpu")
        if mb is None:
            raise ConfigError(f"{self.source or 'config'}: 'train_micro_batch_size_per_gpu' is required "
                              "(the data loader's batch size per GPU)")
        return int(mb)

    @property
    def param_dtype(self) -> "torch.dtype":
        """The model's dtype under DeepSpeed's ``bf16`` / ``fp16`` keys."""
        return ds_param_dtype(self.ds_config)

    @property
    def zero_stage(self) -> int:
        return int((self.ds_config.get("zero_optimization") or {}).get("stage", 0))


def check_top_level_keys(raw: Mapping[str, Any], source: Optional[str] = None) -> None:
    """Raise :class:`ConfigError` for a top-level key that is neither DeepSpeed's nor a project
    section, naming the key, the file and the closest valid key."""
    valid = sorted(DEEPSPEED_TOP_LEVEL_KEYS | set(PROJECT_SECTIONS))
    for key in raw:
        if key.startswith("_") or key in DEEPSPEED_TOP_LEVEL_KEYS or key in PROJECT_SECTIONS:
            continue
        close = difflib.get_close_matches(key, valid, n=1, cutoff=0.6)
        hint = f" (did you mean '{close[0]}'?)" if close else ""
        raise ConfigError(f"{source or 'config'}: unknown top-level key '{key}'{hint}. Valid keys are "
                          f"DeepSpeed's ({', '.join(sorted(DEEPSPEED_TOP_LEVEL_KEYS))}) and the "
                          f"project's sections ({', '.join(PROJECT_SECTIONS)}).")


def _parse_value(text: str) -> Any:
    try:
        return json.loads(text)
    except json.JSONDecodeError:
        return text  # a bare string such as train.output_dir=runs/x


def apply_overrides(raw: dict, overrides: Iterable[str], source: Optional[str] = None) -> dict:
    """Return a copy of ``raw`` with ``dotted.key=value`` overrides applied (value parsed as
    JSON when it parses, else kept as a string; ``null`` sets None)."""
    out = copy.deepcopy(raw)
    for item in overrides:
        if "=" not in item:
            raise ConfigError(f"override {item!r} must look like section.key=value")
        path, value = item.split("=", 1)
        keys = [k for k in path.strip().split(".") if k]
        if not keys:
            raise ConfigError(f"override {item!r} has an empty key")
        node = out
        for k in keys[:-1]:
            child = node.get(k)
            if child is None:
                child = node[k] = {}
            if not isinstance(child, dict):
                raise ConfigError(f"override {item!r}: '{k}' is not an object in {source or 'config'}")
            node = child
        node[keys[-1]] = _parse_value(value)
    return out


def load_config(path: Optional[str] = None, overrides: Iterable[str] = (), *,
                data: Optional[Mapping[str, Any]] = None) -> RunConfig:
    """Read ``path`` (or take ``data``, a dict), apply overrides, validate, parse the sections."""
    from .data import DataConfig  # the data section's dataclass lives beside its loader

    source = os.fspath(path) if path is not None else "<dict>"
    if data is None:
        if path is None:
            raise ConfigError("load_config needs a path or a dict")
        if not os.path.exists(path):
            raise FileNotFoundError(f"config file not found: {path}")
        with open(path) as f:
            try:
                data = json.load(f)
            except json.JSONDecodeError as exc:
                raise ConfigError(f"{path}: not valid JSON: {exc}") from None
    if not isinstance(data, Mapping):
        raise ConfigError(f"{source}: the top level must be a JSON object")
    raw = apply_overrides(dict(data), overrides, source)
    check_top_level_keys(raw, source)
    ds_config = {k: v for k, v in raw.items() if k not in PROJECT_SECTIONS}
    return RunConfig(
        ds_config=ds_config,
        model=ModelConfig.from_dict(raw.get("model"), source),
        data=DataConfig.from_dict(raw.get("data"), source),
        contrastive_loss=ContrastiveLossConfig.from_dict(raw.get("contrastive_loss"), source),
        train=TrainConfig.from_dict(raw.get("train"), source),
        eval=copy.deepcopy(raw["eval"]) if raw.get("eval") is not None else None,
        source=source,
        raw=raw,
    )

