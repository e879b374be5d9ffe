"""The process group of a training run: start-up, rank 0 first, a world of one without a launcher, the end.

Design: :func:`init_distributed` starts DeepSpeed's process group (the launcher's environment,
mpi4py discovery, or the single-process defaults of :func:`single_process_env`). On the CPU,
DeepSpeed JIT-builds a shared-memory all-reduce op (``deepspeed_shm_comm``) into the torch
extensions folder at that point; training never uses it (only ``inference_all_reduce`` does), and a
build that was killed leaves a ``lock`` file on which every later start waits forever without a
word. So the build is skipped on the CPU, and lock files left in the extensions folder are named in
a warning at start-up. :func:`rank_zero_first` is the "rank 0 does it, the others reuse it" step
(digits shards, the BPE tokenizer), which also stops every rank when one of them fails inside.
:func:`exit_process` ends a launched process once its work is done, without the interpreter's
finalization, where gloo's worker threads can abort a run that finished (its docstring says how).
"""

from __future__ import annotations

import atexit
import contextlib
import ctypes
import glob
import importlib
import logging
import os
import re
import socket
import sys
import time
from typing import Iterator, NoReturn

import torch
import torch.distributed as dist

from infclip.ops.config import ConfigError
from infclip.ops.process_groups import host_group

from ..errors import PeerFailedError

__all__ = ["world", "cpu_group", "barrier", "rank_zero_first", "init_distributed", "single_process_env",
           "check_hostfile", "stale_extension_locks", "exit_process", "PeerFailedError"]

logger = logging.getLogger(__name__)

_MPI_ENV = ("OMPI_COMM_WORLD_SIZE", "PMI_SIZE", "PMIX_RANK", "MV2_COMM_WORLD_SIZE")
_LOCK_AGE_S = 300  # the shm op builds in ~35 s, fused Adam in ~60 s: an older lock is left over


def world() -> tuple[int, int]:
    """(rank, world size); (0, 1) without a process group."""
    if dist.is_available() and dist.is_initialized():
        return dist.get_rank(), dist.get_world_size()
    return 0, 1


def cpu_group():
    """A group of all ranks that exchanges CPU tensors without waiting for the GPU's queue: the
    world group when it is gloo, else its gloo twin, made once per process group and shared with
    the loss's own host-side checks (:func:`infclip.ops.process_groups.host_group`); None at world size 1.
    The first call must be made by every rank at the same point (it creates the twin)."""
    if world()[1] == 1:
        return None
    twin = host_group(None)  # None: the world itself takes CPU tensors
    return dist.group.WORLD if twin is None else twin


def barrier() -> None:
    if dist.is_available() and dist.is_initialized():
        dist.barrier()


def _all_ok(ok: bool) -> bool:
    """True when every rank passes ``ok`` (one all-reduce)."""
    device = "cpu"
    if dist.get_backend() == "nccl":
        device = torch.device("cuda", int(os.environ.get("LOCAL_RANK", "0")))
    flag = torch.tensor([1 if ok else 0], dtype=torch.int32, device=device)
    dist.all_reduce(flag, op=dist.ReduceOp.MIN)
    return bool(flag.item())


@contextlib.contextmanager
def rank_zero_first(what: str = "setup") -> Iterator[None]:
    """Run the body on rank 0 first and on the other ranks after it finished (so they reuse what
    rank 0 wrote). If the body fails on any rank, every rank raises (the others
    :class:`PeerFailedError`) instead of waiting forever for it."""
    rank, size = world()
    if size == 1:
        yield
        return
    if rank == 0:
        try:
            yield
        except BaseException:
            _all_ok(False)  # round 1: tell the waiting ranks
            raise
        _all_ok(True)  # round 1
        if not _all_ok(True):  # round 2: the other ranks' turn
            raise PeerFailedError(f"another rank failed during {what} (its error is in its log)")
    else:
        if not _all_ok(True):  # round 1: rank 0's turn
            raise PeerFailedError(f"rank 0 failed during {what} (its error is in its log)")
        try:
            yield
        except BaseException:
            _all_ok(False)  # round 2
            raise
        if not _all_ok(True):
            raise PeerFailedError(f"another rank failed during {what} (its error is in its log)")


def _extension_roots() -> list[str]:
    root = os.environ.get("TORCH_EXTENSIONS_DIR")
    if root:
        return [root]
    from torch.utils.cpp_extension import get_default_build_root

    return glob.glob(os.path.join(get_default_build_root(), f"py{sys.version_info.major}{sys.version_info.minor}*"))


def stale_extension_locks(max_age_s: float = _LOCK_AGE_S) -> list[str]:
    """``lock`` files in the torch extensions folder older than ``max_age_s``: left by a JIT
    build that was killed; torch waits on such a lock forever when it builds that op."""
    now = time.time()
    out = []
    for root in _extension_roots():
        for lock in glob.glob(os.path.join(root, "*", "lock")):
            try:
                if now - os.path.getmtime(lock) > max_age_s:
                    out.append(lock)
            except OSError:
                continue
    return sorted(out)


def init_distributed() -> None:
    """Start DeepSpeed's process group (idempotent), without the CPU shm op build."""
    import deepspeed
    from deepspeed.accelerator import get_accelerator

    for lock in stale_extension_locks():
        logger.warning("stale torch extension build lock %s (older than %d s): if no build is running, remove "
                       "it, or any DeepSpeed op built there waits on it forever", lock, _LOCK_AGE_S)
    if get_accelerator().device_name() == "cpu":
        # DeepSpeed builds deepspeed_shm_comm at process-group start on the CPU (~35 s once, and a
        # hang on a killed build's lock); it serves inference_all_reduce only, never training.
        # (importlib: the attribute deepspeed.comm.torch is the torch package, not this module)
        ds_torch_comm = importlib.import_module("deepspeed.comm.torch")
        ds_torch_comm.build_shm_op = lambda: None
    deepspeed.init_distributed(dist_backend=None, auto_mpi_discovery=True)


_HOSTFILE_LINE = re.compile(r"^(\S+)\s+slots=(\d+)\s*$")


def check_hostfile(path: str) -> dict:
    """The hosts of a DeepSpeed hostfile (``host slots=N`` per line, ``#`` comments), ``{host:
    slots}``, checked as DeepSpeed's launcher would take it, before anything is launched: a line
    of another form, a host given twice, ``slots=0`` or a file without a host raise
    :class:`~pipeline.errors.ConfigError` naming the file and line (the launcher's own errors are
    tracebacks, and it reads a missing hostfile as "this machine only")."""
    if not os.path.isfile(path):
        raise FileNotFoundError(f"hostfile not found: {path}")
    hosts: dict = {}
    with open(path, "rb") as f:
        data = f.read(1 << 20)
    try:
        lines = data.decode("utf-8").splitlines()
    except UnicodeDecodeError:
        raise ConfigError(f"hostfile {path} is not text") from None
    for number, line in enumerate(lines, 1):
        line = line.strip()
        if not line or line.startswith("#"):
            continue
        match = _HOSTFILE_LINE.match(line)
        if match is None:
            raise ConfigError(f"hostfile {path}, line {number}: {line[:80]!r} is not 'HOST slots=N'")
        host, slots = match.group(1), int(match.group(2))
        if host in hosts:
            raise ConfigError(f"hostfile {path}, line {number}: host {host!r} is given twice")
        if slots < 1:
            raise ConfigError(f"hostfile {path}, line {number}: host {host!r} has slots={slots}; it needs at least 1")
        hosts[host] = slots
    if not hosts:
        raise ConfigError(f"hostfile {path} names no host (one 'HOST slots=N' line per node)")
    return hosts


def single_process_env() -> None:
    """Without a launcher (and not under mpirun), make this process a world of one: RANK,
    WORLD_SIZE, LOCAL_RANK, LOCAL_WORLD_SIZE and a free MASTER_PORT on 127.0.0.1 (otherwise
    DeepSpeed goes looking for MPI). Keys already set are kept."""
    if "RANK" in os.environ or any(k in os.environ for k in _MPI_ENV):
        return
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    for key, value in (("RANK", "0"), ("WORLD_SIZE", "1"), ("LOCAL_RANK", "0"), ("LOCAL_WORLD_SIZE", "1"),
                       ("MASTER_ADDR", "127.0.0.1"), ("MASTER_PORT", str(port))):
        os.environ.setdefault(key, value)


def exit_process(code: int) -> NoReturn:
    """End this process with exit code ``code``: destroy the process groups, run the ``atexit``
    handlers (logging's shutdown, multiprocessing's stop of daemonic children, a wandb or Comet
    monitor's finish), flush Python's and C's standard streams, and leave by ``os._exit``, without
    the interpreter's finalization. For a launcher's ``__main__`` once everything is written (event
    files closed, checkpoints and the export renamed into place); never inside a library call.

    Why: ``destroy_process_group`` forgets the groups but does not free them while DeepSpeed (its
    engines, optimizers, parameters' ``ds_process_group``, module globals) still holds them, and a
    gloo group has no shutdown (torch 2.13): its worker threads live on into finalization. The abort
    seen once in a 2-rank ZeRO-3 launch of the CPU tests, after rank 0's last log line ("terminate
    called without an active exception", signal 6, the launcher reporting a finished run as failed),
    is most likely such a worker dropping the last reference to a finished collective's tensor whose
    Python object outlived Python's own reference: freeing it takes the GIL, and a thread that takes
    the GIL during finalization is ended inside a C++ destructor (Python 3.14 would hang it instead).
    A race, not reproduced in 53 further launches (40 of them on a CPU kept busy); leaving before
    finalization closes it either way."""
    if dist.is_available() and dist.is_initialized():
        dist.destroy_process_group()
    atexit._run_exitfuncs()  # while the interpreter is whole (logging.shutdown is one of them)
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except (OSError, ValueError):  # closed, or a pipe whose reader left
            pass
    ctypes.CDLL(None).fflush(None)  # what C and C++ code printed (stdio buffers of a file or a pipe)
    os._exit(code)
