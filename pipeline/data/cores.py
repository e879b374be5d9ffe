"""Where a rank's host threads run: its training thread on a physical core of its own, its loader on the others.

Design: the training thread queues the step's work (kernel launches, the optimizer's host side,
the loader's hand-over); the loader's worker processes and decode threads share the host with it.
Where the scheduler puts one of them on the training thread's core, or on that core's other
hyperthread, the training thread runs slower for the same work and a step whose host side is
close to its GPU time waits on the host. With ``data.reserve_training_core`` each rank's
training loader, while it is iterated, keeps the training thread on one physical core (all its
hyperthreads) and every loader worker and decode thread of the rank on the cores left after
each local rank's reservation; the training thread's former placement comes back when the
loader stops. The reserved cores are the last physical cores the process may use, local rank
``r`` taking the ``r``-th from the end, so ranks sharing a host do not collide. Nothing changes off
Linux (no ``sched_setaffinity``) or when the process may use fewer than
:data:`MIN_CORES_PER_RANK` physical cores per local rank.
"""

from __future__ import annotations

import dataclasses
import logging
import os
from typing import Callable, Iterable, List, Optional, Sequence, Tuple

__all__ = ["CorePlan", "MIN_CORES_PER_RANK", "PIN_TRAINING_THREAD", "enter_cores", "parse_cpu_list", "physical_cores", "plan_cores"]

logger = logging.getLogger(__name__)

MIN_CORES_PER_RANK = 4
"""Physical cores a local rank needs before one of them is kept for its training thread."""
PIN_TRAINING_THREAD = True
"""True: the training thread is moved onto its core; False: it keeps its CPUs and only the loader
is kept off the reserved cores (the scheduler then leaves the training thread where it last ran,
an idle core of its own once it ran there; threads and processes it starts keep every CPU)."""


def parse_cpu_list(text: str) -> List[int]:
    """A kernel CPU list (``"0-3,8,10-11"``) -> its CPUs in order."""
    cpus: List[int] = []
    for part in text.strip().split(","):
        if not part:
            continue
        lo, _, hi = part.partition("-")
        cpus.extend(range(int(lo), int(hi or lo) + 1))
    return cpus


def _sysfs_siblings(cpu: int) -> Sequence[int]:
    """The CPUs sharing ``cpu``'s physical core (itself included), from sysfs; ``[cpu]`` if unknown."""
    try:
        with open(f"/sys/devices/system/cpu/cpu{cpu}/topology/thread_siblings_list") as f:
            return parse_cpu_list(f.read()) or [cpu]
    except (OSError, ValueError):
        return [cpu]


def physical_cores(cpus: Iterable[int],
                   siblings: Callable[[int], Sequence[int]] = _sysfs_siblings) -> List[Tuple[int, ...]]:
    """``cpus`` grouped by physical core (hyperthreads together, only those in ``cpus``), ordered by
    each core's lowest CPU."""
    allowed = sorted(set(cpus))
    cores: dict = {}
    for cpu in allowed:
        core = tuple(sorted(set(siblings(cpu)) & set(allowed))) or (cpu,)
        cores.setdefault(core, None)
    return sorted(cores, key=min)


@dataclasses.dataclass(frozen=True)
class CorePlan:
    """``training``: the CPUs of the rank's training thread (one physical core); ``loader``: those of
    its loader workers and decode threads (every allowed CPU outside all local ranks' reservations)."""

    training: Tuple[int, ...]
    loader: Tuple[int, ...]


def plan_cores(local_rank: int = 0, local_world: int = 1, cpus: Optional[Iterable[int]] = None,
               siblings: Callable[[int], Sequence[int]] = _sysfs_siblings) -> Optional[CorePlan]:
    """The placement of local rank ``local_rank`` of ``local_world`` over ``cpus`` (default: the
    CPUs this process may use), or None where there is no room for it (see the module docstring)."""
    if cpus is None:
        if not hasattr(os, "sched_getaffinity"):
            return None
        cpus = os.sched_getaffinity(0)
    if not 0 <= local_rank < local_world:
        raise ValueError(f"local rank {local_rank} outside {local_world} local ranks")
    cores = physical_cores(cpus, siblings)
    if len(cores) < MIN_CORES_PER_RANK * local_world:
        return None
    reserved = cores[len(cores) - local_world:]
    kept = {cpu for core in reserved for cpu in core}
    loader = tuple(cpu for core in cores for cpu in core if cpu not in kept)
    return CorePlan(training=reserved[local_world - 1 - local_rank], loader=loader) if loader else None


def enter_cores(cpus: Optional[Sequence[int]]) -> Optional[set]:
    """Move the calling thread onto ``cpus`` (None or empty: leave it); its former CPUs, to come back
    to (None when nothing was changed or the platform cannot)."""
    if not cpus or not hasattr(os, "sched_setaffinity"):
        return None
    before = os.sched_getaffinity(0)
    try:
        os.sched_setaffinity(0, cpus)
    except OSError as exc:  # a cgroup that took those CPUs away since: leave the thread where it was
        logger.debug("cannot move thread onto CPUs %s: %s", list(cpus), exc)
        return None
    return before
