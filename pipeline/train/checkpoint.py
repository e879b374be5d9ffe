"""Crash-safe DeepSpeed checkpoints that load without running code from the files.

Design, saving: ``engine.save_checkpoint`` writes ``latest`` itself, from rank 0, as soon as rank
0's own files are written (other ranks may still be writing their ZeRO shards), with a plain
``open(..., 'w')``. So we call it with ``save_latest=False``, let each rank write its RNG state
beside it, barrier, and only then rank 0 writes ``manifest.json`` (every file of the tag with its
size) and moves ``latest`` (temporary file + ``os.replace``, atomic on POSIX). A tag is *complete*
when its manifest is there and every file it lists has the listed size; a run killed at any point
mid-save leaves ``latest`` naming the previous complete tag. ``keep_last`` counts complete tags
only; incomplete tag folders (an interrupted save) are removed at the next save.

Design, finding the tag: ``latest`` is read bounded and followed only to a tag folder inside the
checkpoint folder (:func:`latest_tag`); when it is missing, empty, bad or names a damaged tag,
:func:`newest_checkpoint` takes the newest complete tag instead, saying so, and deletes nothing. A
complete tag is never deleted to make room for a new save of the same step: it is moved aside.

Design, loading: DeepSpeed's own loader unpickles with ``weights_only=False``, so a planted
pickle in any checkpoint file would run code on ``--resume``. :func:`load_checkpoint` first checks
the tag against its manifest (naming a missing, empty or truncated file), then lets DeepSpeed load
through :func:`weights_only_loads`: its checkpoint engine reads every file with
:func:`safe_load` (``torch.load(weights_only=True)`` allowing only DeepSpeed's plain record types,
:func:`safe_globals`), and ``TORCH_FORCE_WEIGHTS_ONLY_LOAD`` covers any ``torch.load`` it makes
outside that engine. A refused file raises :class:`~pipeline.errors.CheckpointError` naming it.

RNG state is per rank (each rank's dropout stream differs) and DeepSpeed keeps ``client_state``
from data-parallel rank 0 only, so each rank saves ``rng_rank{R}.pt`` itself. Limits: a resumed run
with a different world size is refused by the training loop (its data position would be wrong);
the manifest is written by rank 0, so the checkpoint folder must be shared by all ranks (as for
DeepSpeed's own ``latest``). A tag written before manifests existed counts as complete only while
``latest`` names it.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import pickle
import random
import re
import shutil
import time
from pathlib import Path
from typing import Any, Iterator, List, Optional, Union

import numpy as np
import torch

from ..engine.dist import barrier, world
from ..errors import CheckpointError

__all__ = ["capture_rng_state", "restore_rng_state", "save_checkpoint", "load_checkpoint", "resolve_resume",
           "read_latest", "latest_tag", "newest_checkpoint", "list_tags", "tag_for_step", "check_tag", "is_complete",
           "safe_load", "safe_globals",
           "weights_only_loads", "MANIFEST"]

logger = logging.getLogger(__name__)

LATEST = "latest"
MANIFEST = "manifest.json"
_TAG_RE = re.compile(r"^global_step(\d+)$")
_NAME_RE = re.compile(r"^(?!\.\.?$)[A-Za-z0-9_.+-]{1,128}$")  # one folder name, never . or ..
_LATEST_MAX_BYTES = 256
_MANIFEST_MAX_BYTES = 16 << 20  # one line per file of one tag: far below this
PathLike = Union[str, os.PathLike]


def tag_for_step(step: int) -> str:
    return f"global_step{step}"


# ------------------------------------------------------------------------------ safe loading

def safe_globals() -> List[Any]:
    """The DeepSpeed record types its checkpoint files hold besides tensors and plain values:
    the ZeRO stage enum, the fp16 loss-scaler records and the fragment address tuple (data only,
    no behaviour on load). Imported lazily: reading an HF folder does not need DeepSpeed."""
    out: List[Any] = []
    try:
        from deepspeed.runtime.zero.config import ZeroStageEnum
        out.append(ZeroStageEnum)
    except ImportError:
        pass
    try:
        from deepspeed.runtime.fp16.loss_scaler import DynamicLossScaler, LossScaler
        out.extend([LossScaler, DynamicLossScaler])
    except ImportError:
        pass
    try:
        from deepspeed.utils.tensor_fragment import fragment_address
        out.append(fragment_address)
    except ImportError:
        pass
    return out


def safe_load(path: PathLike, map_location: Any = "cpu") -> Any:
    """``torch.load(path, weights_only=True)`` with :func:`safe_globals` allowed.

    Raises :class:`CheckpointError` naming the file when it is missing or empty, cut short or
    not a torch file, or holds any other object (refused: unpickling it could run code)."""
    path = Path(path)
    if not path.is_file():
        raise CheckpointError(f"checkpoint file {path} is missing")
    if path.stat().st_size == 0:
        raise CheckpointError(f"checkpoint file {path} is empty (0 bytes): the save that wrote it was "
                              "interrupted; use an earlier checkpoint")
    try:
        with torch.serialization.safe_globals(safe_globals()):
            return torch.load(path, map_location=map_location, weights_only=True)
    except pickle.UnpicklingError as exc:
        first = str(exc).strip().splitlines()[0][:200] if str(exc).strip() else type(exc).__name__
        if "weights only load failed" in str(exc).lower() or "unsupported global" in str(exc).lower():
            glob = re.search(r"GLOBAL ([\w.]+)", str(exc))
            what = f" ({glob.group(1)})" if glob else ""
            raise CheckpointError(f"refused to load {path}: it holds a Python object{what} that only a full "
                                  "unpickle could build, and unpickling can run code from the file; only "
                                  "tensors and plain values are loaded") from None
        raise CheckpointError(f"cannot read checkpoint file {path}: {first} (truncated or not a torch file)") from None
    except (EOFError, RuntimeError, OSError, ValueError, IndexError, KeyError, AttributeError, TypeError) as exc:
        first = str(exc).strip().splitlines()[0][:200] if str(exc).strip() else type(exc).__name__
        raise CheckpointError(f"cannot read checkpoint file {path}: {first} (truncated or not a torch file)") from None


@contextlib.contextmanager
def weights_only_loads(engine: Any = None) -> Iterator[None]:
    """Every ``torch.load`` inside is weights-only: ``engine``'s checkpoint engine reads through
    :func:`safe_load`, and ``TORCH_FORCE_WEIGHTS_ONLY_LOAD`` turns DeepSpeed's other
    ``torch.load(weights_only=False)`` calls into weights-only ones (torch reads it per call)."""
    saved = {k: os.environ.get(k) for k in ("TORCH_FORCE_WEIGHTS_ONLY_LOAD", "TORCH_FORCE_NO_WEIGHTS_ONLY_LOAD")}
    os.environ["TORCH_FORCE_WEIGHTS_ONLY_LOAD"] = "1"
    os.environ.pop("TORCH_FORCE_NO_WEIGHTS_ONLY_LOAD", None)
    ckpt_engine = getattr(engine, "checkpoint_engine", None) if engine is not None else None
    # DeepSpeed's TorchCheckpointEngine.load is torch.load(weights_only=False): swap it for this
    # load only (an instance attribute, removed again below)
    if ckpt_engine is not None:
        ckpt_engine.load = lambda path, map_location=None: safe_load(path, map_location or "cpu")
    try:
        with torch.serialization.safe_globals(safe_globals()):
            yield
    finally:
        if ckpt_engine is not None:
            del ckpt_engine.load
        for key, value in saved.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value


# ------------------------------------------------------------------------------------ RNG state

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


def restore_rng_state(state: dict, source: str = "RNG state") -> None:
    try:
        py = state["python"]
        random.setstate((py[0], tuple(py[1]), py[2]))
        n = state["numpy"]
        np.random.set_state((n["name"], n["keys"].numpy().astype(np.uint32), n["pos"], n["has_gauss"], n["gauss"]))
        torch.set_rng_state(state["torch"])
    except (KeyError, TypeError, ValueError, IndexError, RuntimeError, AttributeError) as exc:
        raise CheckpointError(f"{source} is not an RNG state written by this project ({exc})") from None
    if "cuda" in state and torch.cuda.is_available():
        cuda = state["cuda"]
        if len(cuda) == torch.cuda.device_count():
            torch.cuda.set_rng_state_all(cuda)
        else:
            logger.warning("checkpoint has CUDA RNG for %d devices, this process sees %d: not restored",
                           len(cuda), torch.cuda.device_count())


# ------------------------------------------------------------------------------- tags and latest

def latest_tag(ckpt_dir: PathLike) -> tuple[Optional[str], Optional[str]]:
    """What ``ckpt_dir/latest`` names: ``(tag, None)`` when it names a tag folder inside
    ``ckpt_dir``, ``(None, what is wrong)`` when it cannot be followed, ``(None, None)`` without one.

    Read bounded (a tag is a short folder name) and never echoed unless it looks like one: a
    ``latest`` may hold anything, up to a whole other file. A tag with a path separator, ``..``,
    an absolute path, or a folder that is a symbolic link (or leads out of ``ckpt_dir``) is refused."""
    ckpt_dir = os.fspath(ckpt_dir)
    path = os.path.join(ckpt_dir, LATEST)
    if not os.path.lexists(path):
        return None, None
    if os.path.islink(path) or not os.path.isfile(path):
        return None, "is not a plain file"
    with open(path, "rb") as f:
        data = f.read(_LATEST_MAX_BYTES + 1)
    if len(data) > _LATEST_MAX_BYTES:
        return None, f"holds more than {_LATEST_MAX_BYTES} bytes, not a tag name"
    try:
        text = data.decode("utf-8").strip()
    except UnicodeDecodeError:
        return None, "is not text"
    if not text:
        return None, "is empty"
    shown = repr(text) if text.isprintable() and len(text) <= 80 else f"{len(data)} bytes"
    if not _NAME_RE.match(text):
        return None, f"holds {shown}, not the name of a folder beside it"
    tag_dir = os.path.join(ckpt_dir, text)
    if os.path.islink(tag_dir) or not os.path.realpath(tag_dir).startswith(os.path.realpath(ckpt_dir) + os.sep):
        return None, f"names tag {shown}, a link out of {ckpt_dir}"
    if not os.path.isdir(tag_dir):
        return None, f"names tag {shown}, which does not exist"
    return text, None


def read_latest(ckpt_dir: PathLike) -> Optional[str]:
    """The tag ``ckpt_dir/latest`` names, when it is a tag folder inside ``ckpt_dir`` (see
    :func:`latest_tag`); else None."""
    return latest_tag(ckpt_dir)[0]


def _write_atomic(path: str, text: str) -> None:
    tmp = os.path.join(os.path.dirname(path), f".{os.path.basename(path)}.tmp{os.getpid()}")
    with open(tmp, "w") as f:
        f.write(text)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)


def check_tag(tag_dir: PathLike, *, legacy_ok: bool = False) -> dict:
    """Check that ``tag_dir`` holds a complete checkpoint; returns its manifest.

    Raises :class:`CheckpointError` naming what is wrong: no manifest (the save did not finish;
    the files there and the empty ones are listed), a listed file missing, empty or of another
    size. ``legacy_ok``: a tag without a manifest (written before manifests existed) passes when
    it has a model-state file and none of its files is empty."""
    tag_dir = Path(tag_dir)
    if not tag_dir.is_dir():
        raise CheckpointError(f"checkpoint {tag_dir} does not exist")
    files = {p.name: p.stat().st_size for p in tag_dir.iterdir() if p.is_file()}
    empty = sorted(n for n, size in files.items() if size == 0)
    manifest_path = tag_dir / MANIFEST
    if not manifest_path.is_file():
        has_model = any(n.endswith("model_states.pt") for n in files)
        if legacy_ok and has_model and not empty:
            return {"files": files, "legacy": True}
        detail = f"empty: {', '.join(empty)}; " if empty else ""
        raise CheckpointError(f"checkpoint {tag_dir} is incomplete: no {MANIFEST} (its save did not finish); "
                              f"{detail}files there: {', '.join(sorted(files)) or 'none'}. Resume from an "
                              "earlier tag, or delete this folder")
    try:
        if manifest_path.stat().st_size > _MANIFEST_MAX_BYTES:
            raise ValueError(f"more than {_MANIFEST_MAX_BYTES} bytes")
        manifest = json.loads(manifest_path.read_text())
        listed = {str(k): int(v) for k, v in manifest["files"].items()}
    except (ValueError, KeyError, TypeError, AttributeError, RecursionError) as exc:
        raise CheckpointError(f"{manifest_path} is damaged ({str(exc)[:200]}): the checkpoint cannot be "
                              "checked") from None
    if not any(name.endswith("model_states.pt") for name in listed):
        raise CheckpointError(f"{manifest_path} lists no model-state file ({len(listed)} file(s) listed): it is not "
                              "the manifest of a complete checkpoint")
    problems = []
    for name, size in sorted(listed.items()):
        if name not in files:
            problems.append(f"{name} is missing")
        elif files[name] == 0 and size != 0:
            problems.append(f"{name} is empty (0 of {size} bytes)")
        elif files[name] != size:
            problems.append(f"{name} has {files[name]} bytes, {size} were written")
    if problems:
        raise CheckpointError(f"checkpoint {tag_dir} is damaged: {'; '.join(problems)}")
    return manifest


def is_complete(tag_dir: PathLike, *, legacy_ok: bool = False) -> bool:
    try:
        check_tag(tag_dir, legacy_ok=legacy_ok)
        return True
    except CheckpointError:
        return False


def list_tags(ckpt_dir: PathLike, complete_only: bool = False) -> list[str]:
    """``global_stepN`` directories under ``ckpt_dir``, oldest first (``complete_only``: those
    that pass :func:`check_tag`, the one ``latest`` names also without a manifest)."""
    if not os.path.isdir(ckpt_dir):
        return []
    # a symbolic link is never a tag: nothing is read or removed through one
    tags = sorted((int(m.group(1)), name) for name in os.listdir(ckpt_dir)
                  if (m := _TAG_RE.match(name)) and os.path.isdir(os.path.join(ckpt_dir, name))
                  and not os.path.islink(os.path.join(ckpt_dir, name)))
    names = [name for _, name in tags]
    if complete_only:
        latest = read_latest(ckpt_dir)
        names = [n for n in names if is_complete(os.path.join(ckpt_dir, n), legacy_ok=n == latest)]
    return names


# ------------------------------------------------------------------------------------- saving

def save_checkpoint(engine: Any, ckpt_dir: PathLike, step: int, client_state: dict, keep_last: int = 0) -> str:
    """Save ``tag_for_step(step)`` on every rank, then write its manifest and move ``latest`` to
    it; returns the tag.

    ``client_state`` must hold only plain Python values (ints, floats, str, lists, dicts).
    ``keep_last`` > 0 deletes complete tags beyond the newest ``keep_last``; incomplete tag
    folders (interrupted saves) are deleted whatever ``keep_last`` is.
    """
    ckpt_dir = os.fspath(ckpt_dir)
    tag = tag_for_step(step)
    rank = world()[0]
    tag_dir = os.path.join(ckpt_dir, tag)
    previous = read_latest(ckpt_dir)
    if rank == 0:
        os.makedirs(ckpt_dir, exist_ok=True)
        if os.path.isdir(tag_dir) and not os.path.islink(tag_dir):
            _clear_tag(tag_dir, legacy_ok=previous == tag)
    barrier()
    engine.save_checkpoint(ckpt_dir, tag=tag, client_state=client_state, save_latest=False)
    torch.save(capture_rng_state(), os.path.join(tag_dir, f"rng_rank{rank}.pt"))
    barrier()
    if rank == 0:
        files = {p.name: p.stat().st_size for p in Path(tag_dir).iterdir() if p.is_file() and p.name != MANIFEST}
        _write_atomic(os.path.join(tag_dir, MANIFEST),
                      json.dumps({"tag": tag, "step": step, "world_size": world()[1], "files": files}, indent=1))
        _write_atomic(os.path.join(ckpt_dir, LATEST), tag)
        _prune(ckpt_dir, tag, previous, keep_last)
    barrier()
    return tag


def _clear_tag(tag_dir: str, legacy_ok: bool) -> None:
    """Make room for a new save of ``tag_dir``: an interrupted save's leftovers are removed; a
    complete checkpoint (a resume from an earlier tag saves over a later one) is moved aside to
    ``<tag>.replaced-<time>``, never deleted nor written over in place (until the new save is
    complete, ``latest`` may name a missing tag: a resume then takes the newest complete one)."""
    if is_complete(tag_dir, legacy_ok=legacy_ok):
        aside = f"{tag_dir}.replaced-{time.strftime('%Y%m%d-%H%M%S')}"
        logger.warning("checkpoint %s is complete and this run saves the same step again: moved to %s", tag_dir,
                       aside)
        os.replace(tag_dir, aside)
    else:
        logger.warning("removing incomplete checkpoint %s (an interrupted save) before saving it again", tag_dir)
        shutil.rmtree(tag_dir)


def _prune(ckpt_dir: str, current: str, previous: Optional[str], keep_last: int) -> None:
    complete = []
    for name in list_tags(ckpt_dir):
        path = os.path.join(ckpt_dir, name)
        if name == current or is_complete(path, legacy_ok=name == previous):
            complete.append(name)
        else:
            logger.warning("removing incomplete checkpoint %s (an interrupted save; never resumed from)", path)
            shutil.rmtree(path, ignore_errors=True)
    if keep_last > 0:
        for old in complete[:-keep_last]:
            if old != current:
                shutil.rmtree(os.path.join(ckpt_dir, old), ignore_errors=True)


# ------------------------------------------------------------------------------------ loading

def resolve_resume(resume: Optional[str], ckpt_dir: PathLike) -> Optional[tuple[str, str]]:
    """Turn ``--resume`` into ``(load_dir, tag)``.

    ``None``: no resume. ``"latest"``: the newest usable checkpoint of ``ckpt_dir`` (see
    :func:`newest_checkpoint`), or None when it holds no complete one (a fresh start). A path: a
    checkpoint directory (the same rule, but one complete checkpoint is required), or one tag
    directory inside one.
    """
    if resume is None:
        return None
    ckpt_dir = os.fspath(ckpt_dir)
    if resume == LATEST:
        found = newest_checkpoint(ckpt_dir)
        if found is None:
            logger.info("--resume latest: no complete checkpoint in %s yet, starting from step 0", ckpt_dir)
        return found
    path = os.path.abspath(resume)
    if not os.path.isdir(path):
        raise FileNotFoundError(f"--resume {resume}: no such checkpoint directory")
    if os.path.lexists(os.path.join(path, LATEST)) or list_tags(path):
        found = newest_checkpoint(path)
        if found is None:
            raise CheckpointError(f"--resume {resume}: no complete checkpoint there (only interrupted saves)")
        return found
    parent, tag = os.path.split(path.rstrip(os.sep))
    if os.path.lexists(os.path.join(parent, LATEST)) or _TAG_RE.match(tag):
        return parent, tag
    raise FileNotFoundError(f"--resume {resume}: neither a checkpoint directory with a '{LATEST}' file "
                            "nor a tag directory inside one")


def newest_checkpoint(ckpt_dir: PathLike) -> Optional[tuple[str, str]]:
    """``(ckpt_dir, tag)`` of the checkpoint to resume: the one ``latest`` names when it is a
    complete tag inside ``ckpt_dir``; else (``latest`` missing, empty, unreadable, pointing out
    of the folder or at a damaged tag) the newest complete tag, named in a warning; None when
    there is neither. Raises :class:`CheckpointError` when ``latest`` cannot be used and no
    complete tag is there to take its place. Nothing is deleted."""
    ckpt_dir = os.fspath(ckpt_dir)
    tag, problem = latest_tag(ckpt_dir)
    if tag is not None:
        try:
            check_tag(os.path.join(ckpt_dir, tag), legacy_ok=True)
            return ckpt_dir, tag
        except CheckpointError as exc:
            problem = f"names {tag!r}, which cannot be used: {exc}"
    complete = [t for t in list_tags(ckpt_dir) if is_complete(os.path.join(ckpt_dir, t))]
    where = os.path.join(ckpt_dir, LATEST)
    if not complete:
        if problem is not None:
            raise CheckpointError(f"{where} {problem}; no other complete checkpoint is in {ckpt_dir}")
        return None
    logger.warning("%s %s: resuming from the newest complete checkpoint, %s (nothing deleted)", where,
                   problem or "is missing", complete[-1])
    return ckpt_dir, complete[-1]


def load_checkpoint(engine: Any, load_dir: PathLike, tag: str) -> dict:
    """Load model, optimizer and scheduler state and this rank's RNG, weights-only; returns the
    client state. Raises :class:`CheckpointError` naming the file or tag that cannot be used."""
    load_dir = os.fspath(load_dir)
    tag_dir = os.path.join(load_dir, tag)
    check_tag(tag_dir, legacy_ok=read_latest(load_dir) == tag)
    loads_universal = getattr(engine, "load_universal_checkpoint", None)
    if callable(loads_universal) and loads_universal():
        raise CheckpointError("DeepSpeed's universal checkpoints ('checkpoint.load_universal') are not supported "
                              "by --resume: DeepSpeed reads them with full unpickling")
    try:
        with weights_only_loads(engine):
            path, client_state = engine.load_checkpoint(load_dir, tag=tag, load_optimizer_states=True,
                                                        load_lr_scheduler_states=True)
    except RuntimeError as exc:  # torch's strict load_state_dict: another model size or layout
        if "state_dict" not in str(exc):
            raise
        lines = [ln.strip() for ln in str(exc).splitlines() if ln.strip()]
        raise CheckpointError(f"checkpoint {tag_dir} does not fit the model the config builds (another model "
                              f"size?): {'; '.join(lines[1:3] or lines[:1])[:400]}") from None
    if path is None:
        raise CheckpointError(f"DeepSpeed found no model-state file for this rank in {tag_dir}")
    rng_path = os.path.join(tag_dir, f"rng_rank{world()[0]}.pt")
    if os.path.isfile(rng_path):
        restore_rng_state(safe_load(rng_path), source=rng_path)
    else:
        logger.warning("%s missing: this rank's RNG is not restored", rng_path)
    return dict(client_state or {})
