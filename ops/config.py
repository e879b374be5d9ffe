"""Typed config sections and the strict parser every section uses.

The project's settings live in the user's DeepSpeed JSON, beside DeepSpeed's own keys. Each
project section (``contrastive_loss`` here; ``model``, ``data``, ``train``, ``eval`` in
``pipeline``) is a dataclass parsed once by :func:`parse_section`, which rejects unknown keys
by name (with a close-match suggestion) and the file they came from. DeepSpeed itself ignores
unknown top-level keys silently, so this is where typos are caught.
"""

from __future__ import annotations

import dataclasses
import difflib
import math
import typing
from typing import Any, Mapping, Optional, TypeVar

DEFAULT_GRAPH_MAX_BATCH = 16384
"""The loss op's default ``graph_max_batch`` (ContrastiveLossConfig.graph_max_batch says what it
does): the batch up to which an idle-stream call replays CUDA graphs."""

DEFAULT_LOGITS_BUDGET_MB = 64.0
"""The loss op's default ``logits_budget_mb`` (ContrastiveLossConfig.logits_budget_mb says what
it does): the MiB it may keep of the B x B logits between forward and backward."""

__all__ = ["ConfigError", "parse_section", "ContrastiveLossConfig"]

T = TypeVar("T")


class ConfigError(ValueError):
    """A config value or key is wrong; the message names the key and the file."""


def _where(section: str, source: Optional[str]) -> str:
    return f"'{section}'" + (f" in {source}" if source else "")


def _describe(hint: Any) -> str:
    """What a value of ``hint`` is, in a config error's words."""
    if typing.get_origin(hint) is typing.Literal:
        return f"one of {list(typing.get_args(hint))}"
    if typing.get_origin(hint) in (list, tuple):
        return "a list"
    return {bool: "true or false", int: "an integer", float: "a number", str: "a string",
            dict: "an object"}.get(typing.get_origin(hint) or hint, str(hint))


def _check_type(value: Any, hint: Any, key: str, where: str) -> Any:
    origin = typing.get_origin(hint)
    args = typing.get_args(hint)
    if hint is Any:
        return value
    if origin is typing.Union:
        if value is None and type(None) in args:
            return None
        options = [arg for arg in args if arg is not type(None)]
        for arg in options:
            try:
                return _check_type(value, arg, key, where)
            except ConfigError:
                pass
        if len(options) == 1:
            return _check_type(value, options[0], key, where)  # its own message
        wanted = " or ".join(_describe(arg) for arg in options)
        raise ConfigError(f"{where}: '{key}' must be {wanted}, got {value!r}")
    if origin is typing.Literal:
        if value not in args:
            raise ConfigError(f"{where}: '{key}' must be one of {list(args)}, got {value!r}")
        return value
    if origin in (list, tuple):
        if not isinstance(value, (list, tuple)):
            raise ConfigError(f"{where}: '{key}' must be a list, got {type(value).__name__}")
        inner = args[0] if args else Any
        return [_check_type(v, inner, f"{key}[{i}]", where) for i, v in enumerate(value)]
    if origin is dict:
        if not isinstance(value, Mapping):
            raise ConfigError(f"{where}: '{key}' must be an object, got {type(value).__name__}")
        return dict(value)
    if hint is bool:
        if not isinstance(value, bool):
            raise ConfigError(f"{where}: '{key}' must be true or false, got {value!r}")
        return value
    if hint is int:
        if isinstance(value, bool) or not isinstance(value, int):
            raise ConfigError(f"{where}: '{key}' must be an integer, got {value!r}")
        return value
    if hint is float:
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise ConfigError(f"{where}: '{key}' must be a number, got {value!r}")
        if not math.isfinite(value):  # JSON's Infinity/NaN parse, but no setting means them
            raise ConfigError(f"{where}: '{key}' must be a finite number, got {value!r}")
        return float(value)
    if hint is str:
        if not isinstance(value, str):
            raise ConfigError(f"{where}: '{key}' must be a string, got {value!r}")
        return value
    return value


def require_at_least(cfg: Any, minimum: int, *keys: str, optional: bool = False) -> None:
    """The range check the config sections share: each field of ``cfg`` named in ``keys`` is
    >= ``minimum`` (with ``optional``, null is accepted too), else a ConfigError naming the key."""
    for key in keys:
        value = getattr(cfg, key)
        if optional and value is None:
            continue
        if value < minimum:
            raise ConfigError(f"'{key}' must be >= {minimum}, got {value}")


def parse_section(cls: type[T], data: Optional[Mapping[str, Any]], section: str,
                  source: Optional[str] = None) -> T:
    """Build dataclass ``cls`` from ``data`` (a JSON object), strictly.

    Unknown keys raise :class:`ConfigError` naming the key, the section and ``source`` (the
    file), with the closest valid key as a hint; values are type-checked against the field
    annotations; the dataclass's own ``__post_init__`` checks ranges.
    """
    where = _where(section, source)
    if data is None:
        data = {}
    if not isinstance(data, Mapping):
        raise ConfigError(f"{where}: section must be a JSON object, got {type(data).__name__}")
    hints = typing.get_type_hints(cls)
    fields = {f.name: f for f in dataclasses.fields(cls) if f.init}
    kwargs = {}
    for key, value in data.items():
        if key.startswith("_"):  # "_comment" style keys are allowed everywhere
            continue
        if key not in fields:
            close = difflib.get_close_matches(key, list(fields), n=1)
            hint = f" (did you mean '{close[0]}'?)" if close else ""
            raise ConfigError(f"{where}: unknown key '{key}'{hint}; valid keys: {sorted(fields)}")
        kwargs[key] = _check_type(value, hints[key], key, where)
    try:
        return cls(**kwargs)
    except ConfigError as exc:
        raise ConfigError(f"{where}: {exc}") from None


@dataclasses.dataclass
class ContrastiveLossConfig:
    """The ``contrastive_loss`` section: which loss, which kernels, which distribution scheme."""

    loss: typing.Literal["clip", "siglip"] = "clip"
    """``clip``: two-direction InfoNCE (softmax over rows and columns). ``siglip``: pairwise
    sigmoid loss with a learnable bias."""
    impl: typing.Literal["auto", "naive", "chunked_torch", "triton"] = "auto"
    """``naive`` builds the full B x B matrix (reference); ``chunked_torch`` tiles in plain torch
    (any device); ``triton`` runs the fused kernels. ``auto``: triton on CUDA, chunked_torch else."""
    triton_interpret: bool = False
    """Without CUDA, run ``impl: triton`` through Triton's CPU interpreter (slow; tests only).
    When false and there is no GPU, ``triton`` falls back to chunked_torch with a warning."""
    label_smoothing: float = 0.0
    """CLIP only: target = (1 - eps) * onehot + eps / B (torch's cross_entropy convention)."""
    allow_tf32: bool = False
    """fp32 features: use TF32 tensor cores (faster, ~1e-3 relative) instead of exact fp32."""
    block_m: Optional[int] = None
    """Row tile of the torch impls; for triton, rows per GEMM band (None: the impl's default;
    triton's bands then hold <= max(B D, 2^24) logits)."""
    block_n: Optional[int] = None
    """Column tile of the torch impls (None: the impl's default; unused by triton)."""
    logits_budget_mb: float = DEFAULT_LOGITS_BUDGET_MB
    """triton: keep the B x B logit matrix from forward to backward when it fits in this many
    MiB: one GEMM less (6 B^2 D FLOPs instead of 8). Whole in fp32 when it fits with the
    backward's B x B gradient (features' dtype): 6 bytes a pair in bf16, B <= 3,344 at 64; else,
    above B = 16,384 with bf16/fp16 features, in their dtype (2 bytes a pair: B <= 65,536 at
    8,192), the backward then working band by band. 0: never (always recompute by row bands,
    O(B D) memory). On an H200 (D = 768, bf16) 8,192 made the loss 0.86-0.88x the time of a
    compiled dense loss at B = 16k-65k (fp32 whole matrix at 16k-32k, bf16 bands at 65k: half
    the dense loss's memory); at B = 4,096 the fp32 whole matrix it allows was slower than
    recomputing (1.37 against 1.04-1.13 ms)."""
    graph_max_batch: int = DEFAULT_GRAPH_MAX_BATCH
    """On one CUDA device, calls of at most this many rows (default 16,384) that find their
    stream idle run the loss's forward and backward as CUDA graphs, captured at the first such
    call of each shape and replayed after (ops/graphs.py): on an idle GPU a call below ~16k rows
    is bound by its host's Python and launches (0.41-1.06x the compiled dense loss at B = 1k-16k
    on an H200 replayed, eager 1.0-1.9x). Each shape captured holds its buffers between calls
    (O(B D), 0.1-0.2 GiB at 1k-16k). Calls behind queued work (a training step's towers) run
    eagerly: there the launches hide. In a ViT-B/32 step at micro-batch 256 the loss's stream is
    busy behind CUDA-graphed towers (no change), idle behind host-bound ones (ZeRO-3: 1.03-1.31x
    faster on an H200; its ~4 GiB peak is the configuration's own). 0: never. Distributed
    schemes always run eagerly."""
    distributed: typing.Literal["none", "gather", "disco", "ring", "hierarchical_ring"] = "none"
    """How the global batch is spread over the data-parallel group (ignored at world size 1)."""
    local_world_size: Optional[int] = None
    """hierarchical_ring: GPUs per node (None: from the launcher's environment, LOCAL_WORLD_SIZE,
    LOCAL_SIZE or OMPI_COMM_WORLD_LOCAL_SIZE)."""
    grad_reduction: typing.Literal["mean", "sum"] = "mean"
    """How the framework combines data-parallel gradients (DeepSpeed/DDP: mean). The feature
    gradients are scaled so that the reduced gradients equal the full-batch ones."""

    def __post_init__(self) -> None:
        if not 0.0 <= self.label_smoothing < 1.0:
            raise ConfigError(f"'label_smoothing' must be in [0, 1), got {self.label_smoothing}")
        if self.label_smoothing and self.loss != "clip":
            raise ConfigError("'label_smoothing' applies to loss 'clip' only")
        require_at_least(self, 1, "block_m", "block_n", "local_world_size", optional=True)
        require_at_least(self, 0, "graph_max_batch")
        if not self.logits_budget_mb >= 0:
            raise ConfigError(f"'logits_budget_mb' must be >= 0, got {self.logits_budget_mb}")

    @classmethod
    def from_dict(cls, data: Optional[Mapping[str, Any]], source: Optional[str] = None
                  ) -> "ContrastiveLossConfig":
        return parse_section(cls, data, "contrastive_loss", source)
