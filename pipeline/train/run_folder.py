"""A run folder belongs to one run: a lock while it runs, and no fresh start over its checkpoints.

Design: rank 0 claims ``train.output_dir`` before anything is written there (:func:`claim_run_folder`).
The claim refuses, with a :class:`~pipeline.errors.RunFolderError` that says what to do instead:
- an output_dir that is a file, or cannot be written;
- a second run while one holds the folder's lock, ``run.lock``: a file with the holder's host,
  pid and process start time, created exclusively. A lock whose process is gone on this host (a
  ``kill -9``, a crash, or a pid now used by another program) is stale and taken over, named in a
  warning;
- a start without ``--resume`` (or a resume from another folder's checkpoint) in a folder that
  holds complete checkpoints: they belong to a run that would otherwise be silently restarted at
  step 0 and pruned away. ``overwrite`` removes them (the ``global_step*`` tags, ``latest``) and the
  run's TensorBoard event files first, and nothing else.

Limit: a lock held on another host cannot be checked from here; it is refused while its file is
there (the message names host, pid and the file to delete once that run is known to be gone).
Only global rank 0 claims the folder: it must be shared by all ranks, as for the checkpoints.
"""

from __future__ import annotations

import glob
import json
import logging
import os
import shutil
import socket
import time
from typing import Optional

from ..errors import CheckpointError, RunFolderError
from .checkpoint import LATEST, list_tags, newest_checkpoint

__all__ = ["RunLock", "claim_run_folder", "LOCK_NAME"]

logger = logging.getLogger(__name__)

LOCK_NAME = "run.lock"
_LOCK_MAX_BYTES = 4096
_UNWRITTEN_LOCK_S = 30.0  # a lock file still without its record after this long was left by a crash


def _start_time(pid: int) -> Optional[str]:
    """The process's start time in clock ticks since boot (Linux ``/proc``), which tells a live
    holder from a later process that got its pid; None when unknown."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[19]
    except (OSError, IndexError):
        return None


def _alive(pid: int, start: Optional[str]) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        pass  # another user's process: alive
    now = _start_time(pid)
    return start is None or now is None or now == start


class RunLock:
    """``<output_dir>/run.lock``, held by this process from :meth:`acquire` to :meth:`release`."""

    def __init__(self, output_dir: str) -> None:
        self.path = os.path.join(output_dir, LOCK_NAME)
        self.held = False

    def acquire(self) -> "RunLock":
        record = {"host": socket.gethostname(), "pid": os.getpid(), "start": _start_time(os.getpid()),
                  "since": time.strftime("%Y-%m-%d %H:%M:%S %z")}
        for _ in range(2):
            try:
                fd = os.open(self.path, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o644)
            except FileExistsError:
                self._take_over_if_stale()
                continue
            with os.fdopen(fd, "w") as f:
                json.dump(record, f)
            self.held = True
            return self
        raise RunFolderError(f"{self.path}: could not take the run lock (another run took it at the same time)")

    def _take_over_if_stale(self) -> None:
        """Remove the lock when its holder is gone; raise RunFolderError when it may be alive."""
        holder = self._holder()
        if holder is None:
            age = time.time() - os.path.getmtime(self.path)
            if age < _UNWRITTEN_LOCK_S:
                raise RunFolderError(f"{self.path}: another run is starting in this folder (its lock is "
                                     f"{age:.0f} s old); use another train.output_dir")
            logger.warning("%s is not a lock record (a run that crashed while taking it): taken over", self.path)
        else:
            host, pid = str(holder.get("host")), holder.get("pid")
            if host != socket.gethostname():
                raise RunFolderError(f"train.output_dir {os.path.dirname(self.path)} is in use by pid {pid} on host "
                                     f"{host} (since {holder.get('since')}): one folder, one run. Use another "
                                     f"train.output_dir, or, once that run is known to be gone, delete {self.path}")
            if isinstance(pid, int) and _alive(pid, holder.get("start")):
                raise RunFolderError(f"train.output_dir {os.path.dirname(self.path)} is in use by a live run (pid "
                                     f"{pid} on this host, since {holder.get('since')}): one folder, one run. Wait for "
                                     "it, stop it, or use another train.output_dir")
            logger.warning("%s was held by pid %s, which is gone (killed or crashed): taken over", self.path, pid)
        try:
            os.unlink(self.path)
        except FileNotFoundError:
            pass

    def _holder(self) -> Optional[dict]:
        try:
            with open(self.path, "rb") as f:
                data = json.loads(f.read(_LOCK_MAX_BYTES).decode("utf-8"))
            return data if isinstance(data, dict) and "pid" in data else None
        except (OSError, ValueError, UnicodeDecodeError):
            return None

    def release(self) -> None:
        """Remove the lock if this process still holds it."""
        if not self.held:
            return
        self.held = False
        holder = self._holder()
        if holder is not None and holder.get("pid") == os.getpid() and holder.get("host") == socket.gethostname():
            os.unlink(self.path)


def _writable_folder(output_dir: str) -> None:
    if os.path.exists(output_dir) and not os.path.isdir(output_dir):
        raise RunFolderError(f"train.output_dir {output_dir} is a file, not a folder")
    try:
        os.makedirs(output_dir, exist_ok=True)
    except OSError as exc:
        raise RunFolderError(f"train.output_dir {output_dir} cannot be created: {exc.strerror}") from None
    if not os.access(output_dir, os.W_OK | os.X_OK):
        raise RunFolderError(f"train.output_dir {output_dir} cannot be written (permission denied)")


def _resumes_here(resume: Optional[str], ckpt_dir: str) -> bool:
    if resume is None:
        return False
    if resume == LATEST:
        return True
    here = os.path.realpath(ckpt_dir)
    there = os.path.realpath(resume)
    return there == here or there.startswith(here + os.sep)


def _remove_run(ckpt_dir: str, tb_dir: Optional[str]) -> None:
    """What ``overwrite`` replaces: the tags and ``latest`` in ``ckpt_dir``, event files in ``tb_dir``
    (None: a TensorBoard folder outside the run folder, maybe shared, is left alone)."""
    removed = [os.path.join(ckpt_dir, t) for t in list_tags(ckpt_dir)]
    for path in removed:
        shutil.rmtree(path)
    if os.path.lexists(os.path.join(ckpt_dir, LATEST)):
        os.unlink(os.path.join(ckpt_dir, LATEST))
    events = [] if tb_dir is None else glob.glob(os.path.join(glob.escape(tb_dir), "**", "events.out.tfevents.*"),
                                                 recursive=True)
    for path in events:
        os.unlink(path)
    logger.warning("overwrite: removed %d checkpoint(s) of the earlier run in %s and %d event file(s) in %s",
                   len(removed), ckpt_dir, len(events), tb_dir)


def claim_run_folder(output_dir: str, ckpt_dir: str, tb_dir: str, *, resume: Optional[str],
                     overwrite: bool) -> RunLock:
    """Rank 0, before anything is written: check ``output_dir`` can hold this run and take its
    lock (returned; release it when the run ends). See the module docstring for what is refused."""
    here = _resumes_here(resume, ckpt_dir)
    if overwrite and here:
        raise RunFolderError(f"--overwrite would delete the checkpoints --resume {resume} continues from: "
                             "pass one of them")
    _writable_folder(output_dir)
    lock = RunLock(output_dir).acquire()
    try:
        if not here:
            try:
                found = newest_checkpoint(ckpt_dir)
            except CheckpointError:
                found = (ckpt_dir, "a damaged one")
            if found is not None and not overwrite:
                raise RunFolderError(f"train.output_dir {output_dir} holds the checkpoints of a run (newest: "
                                     f"{found[1]}): continue it with --resume latest, start this run in another "
                                     "train.output_dir, or pass --overwrite to replace that run")
            if overwrite:
                inside = os.path.realpath(tb_dir).startswith(os.path.realpath(output_dir) + os.sep)
                _remove_run(ckpt_dir, tb_dir if inside else None)
    except BaseException:
        lock.release()
        raise
    return lock
