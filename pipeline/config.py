"""One JSON file per run: DeepSpeed's own keys plus the project's sections, read once.

Design: :func:`load_config` reads the file, applies ``--set section.key=value`` overrides, checks
every TOP-LEVEL key against DeepSpeed's keys (listed once below) and the project's sections, and
parses the project sections into their dataclasses (``model``, ``data``, ``contrastive_loss``,
and ``train``, whose dataclass lives here because every part of the training run reads it, so
this module imports no part of the run). DeepSpeed's keys stay a plain dict for
``deepspeed.initialize`` (which validates its own sections' contents, but ignores unknown
top-level keys: this module is where a typo such as ``zero_optimisation`` gets caught). ``eval``
stays a raw dict: ``pipeline`` never imports ``eval``; ``launch/`` parses it once (into
``eval.EvalConfig``, carried by the evaluator it hands to the training loop).

Limit: the DeepSpeed key list is the one of deepspeed 0.19.x (collected from
``deepspeed/runtime/config.py``, ``runtime/constants.py``, ``monitor/config.py``,
``comm/config.py`` and friends); a key added by a later DeepSpeed release must be added here.
Inside DeepSpeed's sections only what DeepSpeed gets wrong without a word is checked here: batch
sizes must be whole numbers (a fractional micro-batch would train at its floor), numbers must not
be quoted (``"lr": "1e-3"`` ends in a TypeError deep in the optimizer that names no key) and must
be finite; everything else DeepSpeed validates itself.
"""

from __future__ import annotations

import copy
import dataclasses
import difflib
import json
import math
import os
from typing import TYPE_CHECKING, Any, Iterable, List, Literal, Mapping, Optional

from infclip.ops.config import ConfigError, ContrastiveLossConfig, parse_section, require_at_least

from .data.config import DataConfig
from .model.config import ModelConfig, ds_param_dtype

if TYPE_CHECKING:
    import torch

__all__ = ["DEEPSPEED_TOP_LEVEL_KEYS", "PROJECT_SECTIONS", "STOP_SIGNALS", "RunConfig", "TrainConfig", "load_config",
           "apply_overrides", "check_top_level_keys", "check_deepspeed_values", "parse_json", "schedule_warnings"]

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

#: The signals ``train.save_on_signal`` may name (pipeline.train.signals).
STOP_SIGNALS = ("SIGTERM", "SIGUSR1", "SIGUSR2", "SIGINT", "SIGHUP")

#: The project's own top-level sections.
PROJECT_SECTIONS = ("model", "data", "contrastive_loss", "train", "eval")

#: DeepSpeed's batch keys: whole numbers >= 1 (``train_micro_batch_size_per_gpu`` is required).
_DS_BATCH_KEYS = ("train_micro_batch_size_per_gpu", "train_batch_size", "gradient_accumulation_steps")
#: Keys inside DeepSpeed's sections whose value is a name or path, so may look like a number.
_DS_TEXT_KEYS = frozenset({"job_name", "output_path", "project", "team", "group", "nvme_path", "name",
                           "output_file", "checkpoint_dir", "save_dir", "load_dir", "tag"})


@dataclasses.dataclass
class TrainConfig:
    """The ``train`` section: run length, logging, checkpoints, chunking."""

    steps: int = 200
    """Optimizer steps to run (each: gradient_accumulation_steps micro-batches per rank)."""
    epochs: Optional[int] = None
    """Also stop when the data stream has completed this many epochs (None: steps only)."""
    log_every: int = 10
    """Log scalars to TensorBoard and a progress line every this many steps."""
    save_every: int = 0
    """Checkpoint every this many steps (0: only at the end)."""
    save_final: bool = True
    """Checkpoint when the run ends."""
    export_final: bool = True
    """At the end, write output_dir/final: CLIPTowers.save_pretrained + the tokenizer (for eval)."""
    output_dir: str = "runs/default"
    """Run directory: ckpt/ (DeepSpeed checkpoints), tb/ (TensorBoard), tokenizer/, final/. It belongs to
    one run: run.lock while it runs; a start without --resume over its checkpoints is refused
    (pipeline.train.run_folder)."""
    seed: int = 0
    """Seed of the model init (same on all ranks) and of each rank's dropout stream (seed + rank);
    in [0, 2**32)."""
    chunk_size: Optional[int] = None
    """GradCache-style chunked backbone: rows per tower forward (None: the whole micro-batch)."""
    keep_last_checkpoints: int = 2
    """Keep this many newest complete checkpoints (0: keep all); incomplete ones are never kept."""
    weight_decay_1d: bool = False
    """Apply the optimizer's weight decay to 1-D parameters too (biases, norms, logit scale/bias);
    CLIP's default is not to."""
    collapse_window: int = 100
    """Watch for a training collapse over this many optimizer steps (judged at the log steps, so
    over at least log_every; a run shorter than two windows over half its length, at least 10;
    0: off): the loss at chance level (CLIP: ln B of the contrastive
    batch) and the logit scale frozen across the window is named in one warning and logged as
    train/collapsed (pipeline.train.collapse)."""
    collapse_loss_tolerance: float = 0.01
    """Collapse: how close to chance level the loss must stay, relative (CLIP: |loss - ln B| <= this
    x ln B; SigLIP: the loss's spread over the window, relative)."""
    collapse_scale_tolerance: float = 0.001
    """Collapse: the logit scale counts as frozen when it moved less than this (relative) across
    the window."""
    on_collapse: Literal["warn", "stop"] = "warn"
    """On a collapse: ``warn`` (once, the run goes on) or ``stop`` (TrainingCollapseError at that
    log step, before anything after it is evaluated or saved)."""
    save_on_signal: List[str] = dataclasses.field(default_factory=lambda: ["SIGTERM", "SIGUSR1", "SIGINT"])
    """Signals that stop the run after the current step with a checkpoint, exit code 0 (pre-emption:
    SLURM and Kubernetes send SIGTERM before they kill a job, SLURM's ``--signal`` SIGUSR1 ahead of
    the time limit; SIGINT: Ctrl-C, without a traceback). Every rank stops after the same step,
    also when one rank got the signal first; a second signal stops at once, without a checkpoint.
    Any of SIGTERM, SIGUSR1, SIGUSR2, SIGINT, SIGHUP; [] keeps the signals' usual effect
    (pipeline.train.signals)."""

    def __post_init__(self) -> None:
        require_at_least(self, 1, "steps", "log_every")
        require_at_least(self, 0, "save_every", "keep_last_checkpoints", "collapse_window")
        require_at_least(self, 1, "epochs", "chunk_size", optional=True)
        if not self.output_dir:
            raise ConfigError("'output_dir' must not be empty")
        for name in self.save_on_signal:
            if name not in STOP_SIGNALS:
                raise ConfigError(f"'save_on_signal' names {name!r}; it may hold {', '.join(STOP_SIGNALS)}")
        if not 0 <= self.seed < 2**32:
            raise ConfigError(f"'seed' must be in [0, 2**32), got {self.seed}")
        for key in ("collapse_loss_tolerance", "collapse_scale_tolerance"):
            if not 0.0 < getattr(self, key) < 1.0:
                raise ConfigError(f"'{key}' must be in (0, 1), got {getattr(self, key)}")

    @classmethod
    def from_dict(cls, data: Optional[Mapping[str, Any]], source: Optional[str] = None) -> "TrainConfig":
        return parse_section(cls, data, "train", source)


@dataclasses.dataclass
class RunConfig:
    """Everything a run needs, parsed once from one JSON file."""

    ds_config: dict
    """DeepSpeed's keys only, as written (handed to ``deepspeed.initialize``)."""
    model: ModelConfig
    data: DataConfig
    contrastive_loss: ContrastiveLossConfig
    train: TrainConfig
    eval: Optional[dict]
    """The raw ``eval`` section (None when absent); parsed by ``launch/``."""
    source: Optional[str] = None
    """The file it came from (for error messages)."""
    raw: dict = dataclasses.field(default_factory=dict)
    """The whole JSON after overrides (saved with checkpoints)."""

    def __post_init__(self) -> None:
        chunk, micro = self.train.chunk_size, self.ds_config.get("train_micro_batch_size_per_gpu")
        if (self.model.compile_mode == "reduce-overhead" and chunk is not None and isinstance(micro, int)
                and chunk < micro):
            raise ConfigError(f"{self.source or 'config'}: 'model.compile_mode' \"reduce-overhead\" (CUDA graphs) "
                              f"does not work with the chunked backbone ('train.chunk_size' {chunk} < micro-batch "
                              f"{micro}): its first pass keeps every chunk's features while the same graph replays "
                              "over them. Use compile_mode \"default\" there")
        if self.model.flat_parameters and self.model.zero3_init and self.zero_stage == 3:
            raise ConfigError(f"{self.source or 'config'}: 'model.flat_parameters' under ZeRO-3 needs "
                              "'model.zero3_init': false (the blocks are flattened whole, then partitioned by "
                              "deepspeed.initialize)")
        if self.model.flat_parameters == "tower" and self.zero_stage == 3 and self.model.zero3_leaf_layers != "tower":
            raise ConfigError(f"{self.source or 'config'}: 'model.flat_parameters' \"tower\" under ZeRO-3 needs "
                              "'model.zero3_leaf_layers': \"tower\" (each tower's two flat tensors are gathered "
                              "as one unit)")

    @property
    def micro_batch_size(self) -> int:
        """``train_micro_batch_size_per_gpu`` from DeepSpeed's keys (checked at load)."""
        mb = self.ds_config.get("train_micro_batch_size_per_gpu")
        if mb is None:
            raise ConfigError(f"{self.source or 'config'}: 'train_micro_batch_size_per_gpu' is required "
                              "(the data loader's batch size per GPU)")
        return mb

    @property
    def param_dtype(self) -> "torch.dtype":
        """The model's dtype under DeepSpeed's ``bf16`` / ``fp16`` keys."""
        return ds_param_dtype(self.ds_config)

    @property
    def zero_stage(self) -> int:
        return int((self.ds_config.get("zero_optimization") or {}).get("stage", 0))

    @property
    def tensorboard_dir(self) -> str:
        """DeepSpeed's monitor folder when its ``tensorboard`` section is on (our scalars go beside
        its own), else ``<train.output_dir>/tb``."""
        tb = self.ds_config.get("tensorboard") or {}
        if tb.get("enabled") and tb.get("output_path"):
            return os.path.join(tb["output_path"], tb.get("job_name", "DeepSpeedJobName"))
        return os.path.join(self.train.output_dir, "tb")


#: DeepSpeed's schedulers that end at ``scheduler.params.total_num_steps`` (then hold the floor).
_SCHEDULES_WITH_END = ("WarmupDecayLR", "WarmupCosineLR")


def schedule_warnings(run_cfg: RunConfig) -> list[str]:
    """What in the schedule would go unnoticed: ``train.steps`` beyond the scheduler's
    ``total_num_steps`` trains the rest of the run at the schedule's floor."""
    sched = run_cfg.ds_config.get("scheduler") or {}
    total = (sched.get("params") or {}).get("total_num_steps")
    if sched.get("type") in _SCHEDULES_WITH_END and isinstance(total, int) and run_cfg.train.steps > total:
        return [f"{run_cfg.source or 'config'}: 'train.steps' {run_cfg.train.steps} runs past "
                f"'scheduler.params.total_num_steps' {total} ({sched['type']}): the last "
                f"{run_cfg.train.steps - total} steps train at the schedule's floor learning rate"]
    return []


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


def check_deepspeed_values(ds_config: Mapping[str, Any], source: Optional[str] = None) -> None:
    """Raise :class:`ConfigError` naming the key for what DeepSpeed would accept silently or fail
    on far from the cause: a batch key that is not a whole number >= 1, a number written as a
    string (``"lr": "1e-3"``), a non-finite number (``Infinity``, ``NaN``)."""
    where = source or "config"
    mb = ds_config.get("train_micro_batch_size_per_gpu")
    if mb is None:
        raise ConfigError(f"{where}: 'train_micro_batch_size_per_gpu' is required (the data loader's batch "
                          "size per GPU)")
    for key in _DS_BATCH_KEYS:
        value = ds_config.get(key)
        if value is None:
            continue
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise ConfigError(f"{where}: '{key}' must be a whole number >= 1, got {value!r}")

    clip = ds_config.get("gradient_clipping")
    if clip is not None and (isinstance(clip, bool) or not isinstance(clip, (int, float)) or clip < 0):
        raise ConfigError(f"{where}: 'gradient_clipping' must be a number >= 0 (0: off), got {clip!r}; DeepSpeed "
                          "turns a negative one silently off")

    def walk(node: Any, path: str) -> None:
        if isinstance(node, Mapping):
            for k, v in node.items():
                if not str(k).startswith("_"):
                    walk(v, f"{path}.{k}" if path else str(k))
        elif isinstance(node, (list, tuple)):
            for i, v in enumerate(node):
                walk(v, f"{path}[{i}]")
        elif isinstance(node, float) and not math.isfinite(node):
            raise ConfigError(f"{where}: '{path}' must be a finite number, got {node!r}")
        elif isinstance(node, str) and path.rsplit(".", 1)[-1] not in _DS_TEXT_KEYS and _looks_numeric(node):
            raise ConfigError(f"{where}: '{path}' is the string {node!r}; write the number without quotes")

    walk(ds_config, "")


def _looks_numeric(text: str) -> bool:
    try:
        float(text)
    except ValueError:
        return False
    return True


def _unique_keys(pairs: list) -> dict:
    """A JSON object's pairs as a dict; a key given twice is an error (json keeps the last one)."""
    out: dict = {}
    for key, value in pairs:
        if key in out:
            raise ConfigError(f"key '{key}' is given twice in one JSON object (the first would be silently "
                              "ignored)")
        out[key] = value
    return out


def parse_json(text: str, where: str) -> Any:
    """``json.loads`` for configs: a duplicate key, or nesting too deep to parse, is a ConfigError
    naming ``where``; invalid JSON raises ``json.JSONDecodeError``."""
    try:
        return json.loads(text, object_pairs_hook=_unique_keys)
    except ConfigError as exc:
        raise ConfigError(f"{where}: {exc}") from None
    except RecursionError:
        raise ConfigError(f"{where}: nested too deep to parse (not a config)") from None


def _parse_value(text: str) -> Any:
    try:
        return parse_json(text, f"override value {text[:60]!r}")
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
    source = os.fspath(path) if path is not None else "<dict>"
    if data is None:
        if path is None:
            raise ConfigError("load_config needs a path or a dict")
        if not os.path.exists(path):
            raise FileNotFoundError(f"config file not found: {path}")
        with open(path) as f:
            try:
                data = parse_json(f.read(), path)
            except json.JSONDecodeError as exc:
                raise ConfigError(f"{path}: not valid JSON: {exc}") from None
            except UnicodeDecodeError:
                raise ConfigError(f"{path}: not a text file (not valid UTF-8)") from None
    if not isinstance(data, Mapping):
        raise ConfigError(f"{source}: the top level must be a JSON object")
    raw = apply_overrides(dict(data), overrides, source)
    check_top_level_keys(raw, source)
    ds_config = {k: v for k, v in raw.items() if k not in PROJECT_SECTIONS}
    check_deepspeed_values(ds_config, source)
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

