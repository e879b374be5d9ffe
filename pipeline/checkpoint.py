"""Crash-safe DeepSpeed checkpoints: the ``latest`` pointer moves only after every rank is done.

Design: ``engine.save_checkpoint`` writes ``latest`` itself, from rank 0, as soon as rank 0's own
files are written, before its closing barrier, while other ranks may still be writing their ZeRO
shards, and with a plain ``open(..., 'w')`` (a kill mid-write leaves it empty). So we call it with
``save_latest=False``, let each rank write its RNG state beside it, barrier, and only then rank 0
writes ``latest`` to a temporary file and ``os.replace``s it (atomic on POSIX). A run killed at any
point mid-save leaves ``latest`` naming the previous, complete tag; a half-written newer tag
directory is ignored on resume and removed when that tag is saved again. Old tags beyond
``keep_last`` are deleted after the pointer moved.

RNG state is per rank (each rank's dropout stream differs) and DeepSpeed keeps ``client_state``
from data-parallel rank 0 only, so each rank saves ``rng_rank{R}.pt`` itself (tensors and plain
Python values only; read back with ``torch.load(weights_only=True)``). Limit: a resumed run with a
different world size gets fresh per-rank RNG for the ranks that have no file (logged).
"""

from __future__ import annotations

import logging
import os
import random
import re
import shutil
from typing import Any, Optional

import numpy as np
import torch
import torch.distributed as dist

__all__ = ["capture_rng_state", "restore_rng_state", "save_checkpoint", "load_checkpoint",
           "resolve_resume", "read_latest", "list_tags", "tag_for_step"]

logger = logging.getLogger(__name__)

LATEST = "latest"
_TAG_RE = re.compile(r"^global_step(\d+)$")


def tag_for_step(step: int) -> str:
    return f"global_step{step}"


def _rank() -> int:
    return dist.get_rank() if dist.is_available() and dist.is_initialized() else 0


def _barrier() -> None:
    if dist.is_available() and dist.is_initialized():
        dist.barrier()


def capture_rng_state() -> dict:
    """Python, numpy, torch CPU and CUDA generator states as tensors/plain values."""
    np_state = np.random.get_state()
    state = {
        "python": random.getstate(),
        "numpy": {"name": np_state[0], "keys": torch.from_numpy(np_state[1].astype(np.int64)),
                  "pos": int(np_state[2]), "has_gauss": int(np_state[3]), "gauss": float(np_state[4])},
        "torch": torch.get_rng_state(),
    }
    if torch.cuda.is_available():
        state["cuda"] = torch.cuda.get_rng_state_all()
    return state


def restore_rng_state(state: dict) -> None:
    py = state["python"]
    random.setstate((py[0], tuple(py[1]), py[2]))
    n = state["numpy"]
    np.random.set_state((n["name"], n["keys"].numpy().astype(np.uint32), n["pos"], n["has_gauss"], n["gauss"]))
    torch.set_rng_state(state["torch"])
    if "cuda" in state and torch.cuda.is_available():
        cuda = state["cuda"]
        if len(cuda) == torch.cuda.device_count():
            torch.cuda.set_rng_state_all(cuda)
        else:
            logger.warning("checkpoint has CUDA RNG for %d devices, this process sees %d: not restored",
                           len(cuda), torch.cuda.device_count())


def read_latest(ckpt_dir: str) -> Optional[str]:
    path = os.path.join(ckpt_dir, LATEST)
    if not os.path.isfile(path):
        return None
    with open(path) as f:
        tag = f.read().strip()
    return tag or None


def list_tags(ckpt_dir: str) -> list[str]:
    """``global_stepN`` directories under ``ckpt_dir``, oldest first."""
    if not os.path.isdir(ckpt_dir):
        return []
    tags = [(int(m.group(1)), name) for name in os.listdir(ckpt_dir)
            if (m := _TAG_RE.match(name)) and os.path.isdir(os.path.join(ckpt_dir, name))]
    return [name for _, name in sorted(tags)]


def _write_latest(ckpt_dir: str, tag: str) -> None:
    tmp = os.path.join(ckpt_dir, f".{LATEST}.tmp{os.getpid()}")
    with open(tmp, "w") as f:
        f.write(tag)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, os.path.join(ckpt_dir, LATEST))


def save_checkpoint(engine: Any, ckpt_dir: str, step: int, client_state: dict, keep_last: int = 0) -> str:
    """Save ``tag_for_step(step)`` on every rank, then move ``latest`` to it; returns the tag.

    ``client_state`` must hold only plain Python values (ints, floats, str, lists, dicts).
    ``keep_last`` > 0 deletes older tags beyond the newest ``keep_last``.
    """
    tag = tag_for_step(step)
    rank = _rank()
    tag_dir = os.path.join(ckpt_dir, tag)
    if rank == 0:
        os.makedirs(ckpt_dir, exist_ok=True)
        if os.path.isdir(tag_dir) and read_latest(ckpt_dir) != tag:
            # leftovers of an interrupted save of the same tag: start it clean
            logger.warning("removing incomplete checkpoint %s before saving it again", tag_dir)
            shutil.rmtree(tag_dir)
    _barrier()
    engine.save_checkpoint(ckpt_dir, tag=tag, client_state=client_state, save_latest=False)
    torch.save(capture_rng_state(), os.path.join(tag_dir, f"rng_rank{rank}.pt"))
    _barrier()
    if rank == 0:
        _write_latest(ckpt_dir, tag)
        if keep_last > 0:
            for old in list_tags(ckpt_dir)[:-keep_last]:
                if old != tag:
                    shutil.rmtree(os.path.join(ckpt_dir, old), ignore_errors=True)
    _barrier()
    return tag


def resolve_resume(resume: Optional[str], ckpt_dir: str) -> Optional[tuple[str, str]]:
    """Turn ``--resume`` into ``(load_dir, tag)``.

    ``None``: no resume. ``"latest"``: the tag ``ckpt_dir/latest`` names, or None when the run has
    no checkpoint yet (a fresh start). A path: a checkpoint directory holding ``latest``, or one
    tag directory inside such a directory.
    """
    if resume is None:
        return None
    if resume == LATEST:
        tag = read_latest(ckpt_dir)
        if tag is None:
            logger.info("--resume latest: no checkpoint in %s yet, starting from step 0", ckpt_dir)
            return None
        return ckpt_dir, tag
    path = os.path.abspath(resume)
    if not os.path.isdir(path):
        raise FileNotFoundError(f"--resume {resume}: no such checkpoint directory")
    tag = read_latest(path)
    if tag is not None:
        return path, tag
    parent, tag = os.path.split(path.rstrip(os.sep))
    if read_latest(parent) is not None or _TAG_RE.match(tag):
        return parent, tag
    raise FileNotFoundError(f"--resume {resume}: neither a checkpoint directory with a '{LATEST}' file "
                            "nor a tag directory inside one")


def load_checkpoint(engine: Any, load_dir: str, tag: str) -> dict:
    """Load model, optimizer and scheduler state and this rank's RNG; returns the client state."""
    tag_dir = os.path.join(load_dir, tag)
    if not os.path.isdir(tag_dir):
        raise FileNotFoundError(f"checkpoint tag directory not found: {tag_dir}")
    path, client_state = engine.load_checkpoint(load_dir, tag=tag, load_optimizer_states=True,
                                                load_lr_scheduler_states=True)
    if path is None:
        raise RuntimeError(f"DeepSpeed could not load checkpoint {tag_dir}")
    rng_path = os.path.join(tag_dir, f"rng_rank{_rank()}.pt")
    if os.path.isfile(rng_path):
        restore_rng_state(torch.load(rng_path, weights_only=True))
    else:
        logger.warning("%s missing: this rank's RNG is not restored", rng_path)
    return dict(client_state or {})
