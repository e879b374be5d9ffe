"""Loading a trained model for evaluation: DeepSpeed checkpoints (any ZeRO stage) consolidated to
fp32 on the CPU, or an exported HF folder; and exporting a checkpoint as one folder that
transformers loads as a ``CLIPModel`` / ``CLIPProcessor`` / zero-shot pipeline.

Design: DeepSpeed's own ``zero_to_fp32`` unpickles every file with ``weights_only=False``; this
module reads the same files with ``pipeline.train.checkpoint.safe_load`` (``torch.load(weights_only=True)``
allowing only the plain DeepSpeed record types its optimizer files hold: the ZeRO stage enum, the
loss-scaler records, the fragment address tuple), after checking the tag against the manifest
``pipeline.train.checkpoint`` writes (a half-written tag is named, with its missing or empty files), and
rebuilds the full fp32 weights itself:
- ZeRO 0: the module weights in ``mp_rank_00_model_states.pt`` (in the training dtype: with bf16
  or fp16 and no ZeRO, DeepSpeed does not record which master tensor belongs to which name, so
  the low-precision copy that the forward pass used is taken; a warning says so);
- ZeRO 1/2: each rank's fp32 partition of every param group is concatenated in rank order and cut
  into parameters in ``param_shapes`` order, skipping the alignment padding DeepSpeed records;
- ZeRO 3: each parameter is split ``ceil(numel / world)`` per rank; the pieces are taken from every
  rank's flat fp32 group at the running offset, concatenated and trimmed.
Frozen parameters, buffers and tied parameters come from the model-state files. The result is
loaded into a model built from the run's saved config with a strict name-and-shape check, so a
checkpoint from another model size fails naming the first mismatching parameters.

Limit: data parallelism only (no tensor/pipeline model-parallel checkpoints: ``mp_rank_00``);
the whole model is materialised in CPU memory (fine up to a few billion parameters).
"""

from __future__ import annotations

import dataclasses
import json
import logging
import math
import re
from pathlib import Path
from typing import Any, Dict, List, Mapping, Optional, Tuple, Union

import torch
from torch import Tensor, nn

from infclip.pipeline.errors import CheckpointError
from infclip.pipeline.model.flat_params import expand_flat_entries
from infclip.pipeline.model.model import is_hf_clip_folder
from infclip.pipeline.model.openclip import OPENCLIP_CONFIG_FILE, OPENCLIP_WEIGHTS_FILE, towers_to_openclip
from infclip.pipeline.train.checkpoint import check_tag, latest_tag, safe_load

__all__ = [
    "LoadedModel",
    "consolidate_fp32_state_dict",
    "export_hf",
    "export_openclip",
    "find_tag_dir",
    "image_normalization",
    "find_run_files",
    "load_model",
    "load_state_dict_strict",
]

logger = logging.getLogger(__name__)

PathLike = Union[str, Path]

CONFIG_NAMES = ("run_config.json", "config.json")
"""File names searched for the run's JSON config (with a ``model`` section)."""
TOKENIZER_DIR = "tokenizer"
"""Folder name searched for the run's tokenizer."""
RUN_CKPT_DIR = "ckpt"
"""Where ``pipeline.train.train`` puts DeepSpeed checkpoints inside the run folder."""


# --------------------------------------------------------------------------------- safe loading

def _load(path: Path) -> Dict[str, Any]:
    """``pipeline.train.checkpoint.safe_load``: weights-only, DeepSpeed's record types allowed; a
    missing, empty, truncated or refused file is a CheckpointError naming it."""
    return safe_load(path, map_location="cpu")


# ------------------------------------------------------------------------------ finding things

def find_tag_dir(checkpoint: PathLike, tag: Optional[str] = None) -> Path:
    """The folder holding one DeepSpeed checkpoint's ``*_model_states.pt`` files.

    ``checkpoint`` is the folder given to ``engine.save_checkpoint`` (with ``tag`` or its
    ``latest`` file naming the sub-folder), a tag folder itself, or a training run folder
    (``pipeline.train.train`` keeps its checkpoints in ``<run>/ckpt``).
    """
    path = Path(checkpoint)
    if not path.is_dir():
        raise FileNotFoundError(f"checkpoint folder not found: {path}")
    if (path / RUN_CKPT_DIR).is_dir() and not (path / "latest").is_file() \
            and not any(path.glob("*_model_states.pt")):
        path = path / RUN_CKPT_DIR
    if tag is not None:
        tag_dir = path / tag
        if not tag_dir.is_dir():
            have = sorted(p.name for p in path.iterdir() if p.is_dir())
            raise FileNotFoundError(f"checkpoint tag '{tag}' not found in {path} (tags there: {have})")
    elif any(path.glob("*_model_states.pt")):
        tag_dir = path
    elif (path / "latest").is_file():
        name, problem = latest_tag(path)  # read bounded, followed only to a tag folder inside path
        if name is None:
            error = FileNotFoundError if problem.endswith("does not exist") else CheckpointError
            raise error(f"{path / 'latest'} {problem}; pass --tag")
        tag_dir = path / name
    else:
        raise FileNotFoundError(f"no DeepSpeed checkpoint in {path}: no '*_model_states.pt' files and no "
                                f"'latest' file (pass the folder given to save_checkpoint, or a tag)")
    if not any(tag_dir.glob("*_model_states.pt")):
        raise CheckpointError(f"{tag_dir} holds no '*_model_states.pt' file")
    # written by pipeline.train.checkpoint: its manifest must be there and match; other writers (a bare
    # engine.save_checkpoint) have none, and their files are only checked to be non-empty
    named = latest_tag(tag_dir.parent)[0] == tag_dir.name
    check_tag(tag_dir, legacy_ok=named or not (tag_dir / "rng_rank0.pt").exists())
    return tag_dir


def _rank_of(path: Path) -> int:
    match = re.search(r"zero_pp_rank_(\d+)_", path.name)
    return int(match.group(1)) if match else 0


def _rank_files(tag_dir: Path, pattern: str) -> List[Path]:
    return sorted(tag_dir.glob(pattern), key=_rank_of)


# ---------------------------------------------------------------------------- consolidation

def _zero12_params(states: List[Dict[str, Any]], optims: List[Dict[str, Any]], where: Path) -> Dict[str, Tensor]:
    param_shapes = states[0]["param_shapes"]
    world = len(optims)
    groups = [o["single_partition_of_fp32_groups"] for o in optims]
    paddings = optims[0].get("param_alignment_paddings")
    out: Dict[str, Tensor] = {}
    for g, shapes in enumerate(param_shapes):
        full = torch.cat([groups[r][g].float() for r in range(world)])
        pads = paddings[g] if paddings is not None else [0] * len(shapes)
        if len(pads) != len(shapes):
            raise CheckpointError(f"{where}: group {g} has {len(shapes)} parameters but {len(pads)} paddings")
        offset = 0
        for (name, shape), pad in zip(shapes.items(), pads):
            numel = math.prod(shape)
            if offset + numel > full.numel():
                raise CheckpointError(f"{where}: parameter '{name}' {tuple(shape)} runs past the end of fp32 "
                                 f"group {g} ({full.numel()} values): the checkpoint is incomplete")
            out[name] = full[offset:offset + numel].view(tuple(shape)).clone()
            offset += numel + pad
        align = 2 * world  # DeepSpeed pads each group to a multiple of 2 * world size
        if math.ceil(offset / align) != math.ceil(full.numel() / align):
            raise CheckpointError(f"{where}: group {g} used {offset} of {full.numel()} fp32 values: the "
                             "partition layout does not match the recorded parameter shapes")
    return out


def _zero3_params(states: List[Dict[str, Any]], optims: List[Dict[str, Any]], where: Path) -> Dict[str, Tensor]:
    world = len(optims)
    flats = [torch.cat([t.float().reshape(-1) for t in o["fp32_flat_groups"]]) for o in optims]
    shapes: Dict[str, Any] = {}
    for group in states[0]["param_shapes"]:
        shapes.update(group)
    out: Dict[str, Tensor] = {}
    offset = 0
    for name, shape in shapes.items():
        numel = math.prod(shape)
        part = math.ceil(numel / world)
        if offset + part > flats[0].numel():
            raise CheckpointError(f"{where}: parameter '{name}' {tuple(shape)} runs past the end of the fp32 "
                             "partitions: the checkpoint is incomplete")
        pieces = [flats[r][offset:offset + part] for r in range(world)]
        out[name] = torch.cat(pieces)[:numel].view(tuple(shape)).clone()
        offset += part
    if offset != flats[0].numel():
        raise CheckpointError(f"{where}: used {offset} of {flats[0].numel()} fp32 values per rank: the partition "
                         "layout does not match the recorded parameter shapes")
    return out


def _frozen_params(states: List[Dict[str, Any]], stage: int) -> Dict[str, Tensor]:
    shapes = states[0].get("frozen_param_shapes") or {}
    out: Dict[str, Tensor] = {}
    for name, shape in shapes.items():
        numel = math.prod(shape)
        if stage == 3:
            flat = torch.cat([s["frozen_param_fragments"][name].reshape(-1) for s in states])
            out[name] = flat[:numel].view(tuple(shape)).float().clone()
        else:
            out[name] = states[0]["frozen_param_fragments"][name].reshape(tuple(shape)).float().clone()
    return out


def consolidate_fp32_state_dict(checkpoint: PathLike, tag: Optional[str] = None) -> Tuple[Dict[str, Tensor], Dict[str, Any]]:
    """Full fp32 weights of a DeepSpeed checkpoint (ZeRO 0-3), on the CPU, no GPU needed.

    Args:
        checkpoint: the folder given to ``engine.save_checkpoint`` (uses ``tag`` or ``latest``),
            or a tag folder.
    Returns:
        ``(state_dict, info)``: name -> fp32 tensor (floating tensors; integer buffers kept), and
        ``{"tag_dir", "zero_stage", "world_size", "global_steps", "ds_version"}``.
    """
    tag_dir = find_tag_dir(checkpoint, tag)
    model_files = _rank_files(tag_dir, "*_model_states.pt")
    states = [_load(p) for p in model_files]
    first = states[0]
    if "module" not in first:
        raise CheckpointError(f"{model_files[0]} is not a DeepSpeed model-state file (no 'module' entry)")
    optim_files = _rank_files(tag_dir, "*_optim_states.pt")
    optims = []
    for p in optim_files:
        osd = _load(p).get("optimizer_state_dict") or {}
        osd.pop("base_optimizer_state", None)  # Adam moments: not needed
        osd.pop("optimizer_state_dict", None)
        optims.append(osd)
    stage = int(optims[0]["zero_stage"]) if optims and "zero_stage" in optims[0] else 0
    info = {"tag_dir": str(tag_dir), "zero_stage": stage, "world_size": max(1, len(optims)),
            "global_steps": first.get("global_steps"), "ds_version": first.get("ds_version")}
    buffer_names = set(first.get("buffer_names") or [])
    if stage == 0:
        sd = {k: (v.float() if v.is_floating_point() else v).clone() for k, v in first["module"].items()}
        low = sorted({str(v.dtype) for v in first["module"].values() if v.dtype in (torch.bfloat16, torch.float16)})
        if low:
            logger.warning("%s: ZeRO-0 checkpoint holds %s module weights (no named fp32 master copy); "
                           "they are upcast to fp32", tag_dir, "/".join(low))
        return sd, info
    world = optims[0].get("partition_count")
    world = max(world) if isinstance(world, list) else int(world)
    if world != len(optims):
        raise CheckpointError(f"{tag_dir}: the checkpoint was written by {world} ranks but {len(optims)} "
                         "'*_optim_states.pt' files are there (missing or extra rank files)")
    if stage == 3 and len(states) != world:
        raise CheckpointError(f"{tag_dir}: ZeRO-3 needs {world} model-state files, found {len(states)}")
    info["world_size"] = world
    sd: Dict[str, Tensor] = {}
    for name, value in first["module"].items():
        if name in buffer_names:
            sd[name] = (value.float() if value.is_floating_point() else value).clone()
    sd.update(_frozen_params(states, stage))
    sd.update(_zero3_params(states, optims, tag_dir) if stage == 3 else _zero12_params(states, optims, tag_dir))
    if stage in (1, 2):
        # frozen parameters (locked towers) have no optimizer partition, and DeepSpeed records
        # them as frozen only from stage 2 on: at stage 1 they are only in the module state
        for name, value in first["module"].items():
            if name not in sd:
                sd[name] = (value.float() if value.is_floating_point() else value).clone()
    for alias, target in (first.get("shared_params") or {}).items():
        if target in sd:
            sd[alias] = sd[target]
    return sd, info


# ------------------------------------------------------------------------------ strict loading

def load_state_dict_strict(model: nn.Module, state_dict: Mapping[str, Tensor], source: str = "checkpoint") -> None:
    """Copy ``state_dict`` into ``model`` after checking names and shapes match exactly.

    Raises ``ValueError`` naming the first mismatching parameters (shape, missing, unexpected),
    e.g. when the checkpoint comes from a different model size than the config builds.
    """
    state_dict = expand_flat_entries(state_dict, model)  # names of ZeRO partitions of flat parameters
    expected = model.state_dict()
    problems = []
    for name, tensor in expected.items():
        if name in state_dict and tuple(state_dict[name].shape) != tuple(tensor.shape):
            problems.append(f"shape mismatch for parameter '{name}': {source} has "
                            f"{list(state_dict[name].shape)}, the model has {list(tensor.shape)}")
    missing = [n for n in expected if n not in state_dict]
    unexpected = [n for n in state_dict if n not in expected]
    if missing:
        problems.append(f"{len(missing)} parameter(s) missing from {source}: {missing[:5]}")
    if unexpected:
        problems.append(f"{len(unexpected)} unexpected parameter(s) in {source}: {unexpected[:5]}")
    if problems:
        shown = "; ".join(problems[:6]) + (f"; ... ({len(problems) - 6} more)" if len(problems) > 6 else "")
        raise CheckpointError(f"{source} does not fit the model (was it trained with another model config?): {shown}")
    model.load_state_dict({name: state_dict[name] for name in expected}, strict=True)


# ------------------------------------------------------------------------------ model loading

@dataclasses.dataclass
class LoadedModel:
    """A model ready for evaluation and what came with it."""

    model: Any
    """``pipeline.model.model.CLIPTowers`` in eval mode, fp32."""
    tokenizer: Any
    """The run's HF tokenizer."""
    source: str
    """Where it came from (checkpoint tag folder or HF folder)."""
    info: Dict[str, Any]
    """Checkpoint facts (zero stage, world size, step) or ``{}`` for an HF folder."""
    run_config: Optional[Dict[str, Any]] = None
    """The run's raw JSON config when found (eval, data sections for the preprocessing)."""


def _is_hf_folder(path: Path) -> bool:
    """An export: a transformers CLIPModel folder, or the two towers' folders."""
    return is_hf_clip_folder(str(path)) or ((path / "vision").is_dir() and (path / "text").is_dir())


def _folder_tokenizer(path: Path) -> Optional[Path]:
    """An exported folder's tokenizer: its root, or the ``tokenizer/`` of an older export."""
    if (path / TOKENIZER_DIR).is_dir():
        return path / TOKENIZER_DIR
    return path if (path / "tokenizer_config.json").is_file() else None


def find_run_files(start: PathLike, max_up: int = 3) -> Tuple[Optional[Path], Optional[Path]]:
    """The run's JSON config and tokenizer folder, searched in ``start`` and up to ``max_up``
    parent folders (the tag folder, the checkpoint folder, the run folder)."""
    config = tokenizer = None
    here = Path(start).resolve()
    for _ in range(max_up + 1):
        if config is None:
            for name in CONFIG_NAMES:
                candidate = here / name
                if candidate.is_file() and _has_model_section(candidate):
                    config = candidate
                    break
        if tokenizer is None and (here / TOKENIZER_DIR).is_dir():
            tokenizer = here / TOKENIZER_DIR
        if config is not None and tokenizer is not None:
            break
        if here.parent == here:
            break
        here = here.parent
    return config, tokenizer


def _has_model_section(path: Path) -> bool:
    try:
        return isinstance(json.loads(path.read_text()).get("model"), dict)
    except (ValueError, OSError, AttributeError):
        return False


def load_model(path: PathLike, tag: Optional[str] = None, *, config: Optional[PathLike] = None,
               tokenizer: Optional[PathLike] = None, device: Union[str, torch.device] = "cpu") -> LoadedModel:
    """Load a model for evaluation from a DeepSpeed checkpoint or an exported HF folder.

    Args:
        path: a folder written by ``CLIPTowers.save_pretrained`` (``vision/``, ``text/``), or a
            DeepSpeed checkpoint folder / tag folder (see :func:`find_tag_dir`).
        tag: checkpoint tag (default: the ``latest`` file).
        config: the run's JSON config (default: ``run_config.json`` / ``config.json`` found in
            the checkpoint folder or its parents). Its ``model`` section builds the model.
        tokenizer: tokenizer folder (default: ``tokenizer/`` beside the config or checkpoint, else
            the run config's ``data.tokenizer``).
        device: where the model goes after loading on the CPU.
    """
    from infclip.pipeline.data.tokenizer import load_tokenizer
    from infclip.pipeline.model.config import ModelConfig
    from infclip.pipeline.model.model import CLIPTowers

    path = Path(path)
    if not path.exists():
        raise FileNotFoundError(f"checkpoint not found: {path}")
    if _is_hf_folder(path) or (path / OPENCLIP_CONFIG_FILE).is_file():
        model = CLIPTowers.from_pretrained(str(path))
        tok_dir = Path(tokenizer) if tokenizer else _folder_tokenizer(path)
        if tok_dir is None:
            _, tok_dir = find_run_files(path)
        if tok_dir is None:
            raise FileNotFoundError(f"no tokenizer for {path}: expected {path / TOKENIZER_DIR} (pass tokenizer=)")
        run_cfg = json.loads(Path(config).read_text()) if config else None
        model.eval().to(device)
        return LoadedModel(model, load_tokenizer(tok_dir), str(path), {}, run_cfg)

    tag_dir = find_tag_dir(path, tag)
    found_cfg, found_tok = find_run_files(tag_dir)
    cfg_path = Path(config) if config else found_cfg
    if cfg_path is None:
        raise FileNotFoundError(f"no run config with a 'model' section found for {tag_dir} (looked for "
                                f"{' / '.join(CONFIG_NAMES)} there and in its parent folders); pass config=")
    raw = json.loads(cfg_path.read_text())
    tok_dir = Path(tokenizer) if tokenizer else (found_tok or _recorded_tokenizer(raw))
    if tok_dir is None:
        raise FileNotFoundError(f"no '{TOKENIZER_DIR}/' folder found for {tag_dir} or its parent folders, and "
                                f"{cfg_path} names no data.tokenizer folder; pass tokenizer=")
    model_section = dict(raw.get("model") or {})
    pretrained = model_section.get("pretrained")
    if pretrained and not Path(pretrained).exists():
        raise FileNotFoundError(f"{cfg_path}: model.pretrained {pretrained} is gone; the tower sizes come "
                                "from it, so the model cannot be rebuilt")
    model_cfg = ModelConfig.from_dict(model_section, source=str(cfg_path))
    tok = load_tokenizer(tok_dir)
    model = CLIPTowers.from_config(model_cfg, tok)
    state, info = consolidate_fp32_state_dict(path, tag)
    load_state_dict_strict(model, state, source=f"checkpoint {info['tag_dir']}")
    model.float().eval().to(device)
    info.update(config=str(cfg_path), tokenizer=str(tok_dir))
    logger.info("loaded %s (ZeRO %d, %d rank(s), step %s)", info["tag_dir"], info["zero_stage"],
                info["world_size"], info["global_steps"])
    return LoadedModel(model, tok, info["tag_dir"], info, raw)


def _recorded_tokenizer(run_config: Mapping[str, Any]) -> Optional[Path]:
    """The tokenizer folder a run loaded (its ``data.tokenizer``; the run then stores no copy)."""
    data = run_config.get("data") or {}
    named = data.get("tokenizer") if isinstance(data, dict) else None
    return Path(named) if isinstance(named, str) and Path(named).is_dir() else None


def image_normalization(run_config: Optional[Mapping[str, Any]]) -> Tuple[Optional[List[float]], Optional[List[float]]]:
    """``(image_mean, image_std)`` of a run's raw JSON config (its ``data`` section), None for
    what it does not set (the exported image processor then uses CLIP's)."""
    data = (run_config or {}).get("data") or {}
    if not isinstance(data, dict):
        return None, None
    return data.get("image_mean"), data.get("image_std")


def _load_for_export(checkpoint: PathLike, tag: Optional[str], config: Optional[PathLike],
                     tokenizer: Optional[PathLike]) -> Tuple[LoadedModel, Dict[str, Any]]:
    """The model to export and its run's raw config (``config``, the one the load found, or the
    ``config.json`` beside the checkpoint or up to three folders up; ``{}`` when there is none)."""
    loaded = load_model(checkpoint, tag, config=config, tokenizer=tokenizer)
    run_cfg = loaded.run_config
    if run_cfg is None:
        found, _ = find_run_files(checkpoint)
        run_cfg = json.loads(found.read_text()) if found is not None else {}
    return loaded, run_cfg


def export_hf(checkpoint: PathLike, out_dir: PathLike, tag: Optional[str] = None, *,
              config: Optional[PathLike] = None, tokenizer: Optional[PathLike] = None) -> str:
    """Write a DeepSpeed checkpoint (or re-write an exported folder) as one folder in
    transformers' standard layout that this project reads back exactly (``CLIPTowers.save_pretrained``
    with the tokenizer and the run's image normalisation):

    - ``config.json`` + ``model.safetensors``: a ``transformers.CLIPModel`` whose
      ``get_image_features`` / ``get_text_features`` equal ``encode_image`` / ``encode_text``
      and whose ``logit_scale`` is the run's (clamped to ``max_logit_scale``);
    - ``tokenizer.json`` / ``tokenizer_config.json`` (BOS/EOS added by the tokenizer's own
      post-processor, truncation and padding to the context length) and ``processor_config.json``
      (``CLIPImageProcessor``: the run's image size, the ``data`` section's mean/std), so that
      ``CLIPProcessor.from_pretrained`` and the ``zero-shot-image-classification`` pipeline load it;
    - in ``config.json``'s ``infclip`` entry, what transformers has no field for (the raw logit
      scale and bias, ``max_logit_scale``, the model section), so ``CLIPTowers.from_pretrained``,
      ``model.pretrained`` and ``--checkpoint`` read the folder back exactly.

    The mean/std come from the run's config (``config``, or ``config.json`` found beside the
    checkpoint or up to three folders up); CLIP's when there is none. Returns ``out_dir``."""
    loaded, run_cfg = _load_for_export(checkpoint, tag, config, tokenizer)
    mean, std = image_normalization(run_cfg)
    out = Path(out_dir)
    loaded.model.save_pretrained(str(out), tokenizer=loaded.tokenizer, image_mean=mean, image_std=std)
    logger.info("exported %s -> %s", loaded.source, out)
    return str(out)


def export_openclip(checkpoint: PathLike, out_dir: PathLike, tag: Optional[str] = None, *,
                    config: Optional[PathLike] = None, tokenizer: Optional[PathLike] = None) -> str:
    """Write a DeepSpeed checkpoint (or an exported folder) as an OpenCLIP model folder, the layout
    of OpenCLIP's hf-hub models, which ``open_clip.create_model_and_transforms("local-dir:OUT")``
    and ``open_clip.get_tokenizer("local-dir:OUT")`` load:

    - ``open_clip_model.safetensors``: an OpenCLIP ``CLIP`` state dict whose ``encode_image`` /
      ``encode_text`` equal the project's (:func:`pipeline.model.openclip.towers_to_openclip`; text pooled
      at the tokenizer's EOS, ``pool_type: "eos"``), with the run's logit scale (and bias, for a
      SigLIP run);
    - ``open_clip_config.json``: ``model_cfg`` (sizes, head widths, QuickGELU) and ``preprocess_cfg``
      (the run's image size and ``data`` mean/std, bicubic resize of the shorter side and centre
      crop: the project's evaluation transform);
    - the run's tokenizer with its CLIP template (``tokenizer.json``, ...), named by
      ``text_cfg.hf_tokenizer_name`` (this folder's path; OpenCLIP's ``local-dir:`` reads it from the
      folder wherever it is): OpenCLIP tokenizes as the run did.

    The folder is also a ``model.pretrained`` and a ``--checkpoint`` here. Returns ``out_dir``."""
    from safetensors.torch import save_file

    from infclip.pipeline.data.config import CLIP_MEAN, CLIP_STD
    from infclip.pipeline.data.tokenizer import with_clip_template

    loaded, run_cfg = _load_for_export(checkpoint, tag, config, tokenizer)
    mean, std = image_normalization(run_cfg)
    siglip = ((run_cfg.get("contrastive_loss") or {}).get("loss")) == "siglip"
    state, model_cfg = towers_to_openclip(loaded.model, logit_bias=siglip)
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    model_cfg["text_cfg"]["hf_tokenizer_name"] = str(out.resolve())
    preprocess = {"size": loaded.model.image_size, "mean": list(mean or CLIP_MEAN), "std": list(std or CLIP_STD),
                  "interpolation": "bicubic", "resize_mode": "shortest"}
    save_file(state, str(out / OPENCLIP_WEIGHTS_FILE))
    (out / OPENCLIP_CONFIG_FILE).write_text(json.dumps({"model_cfg": model_cfg, "preprocess_cfg": preprocess},
                                                       indent=2))
    with_clip_template(loaded.tokenizer, loaded.model.context_length).save_pretrained(str(out))
    logger.info("exported %s -> %s (OpenCLIP)", loaded.source, out)
    return str(out)
