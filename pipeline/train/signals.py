"""Pre-emption: a signal makes the run stop at the next step boundary, with a checkpoint.

Design: :class:`StopSignals` installs handlers for ``train.save_on_signal`` (SIGTERM, what SLURM
and Kubernetes send before they kill a job; SIGUSR1, what SLURM's ``--signal`` sends ahead of the
time limit; SIGINT, Ctrl-C). The first signal only sets a flag (and says so on stderr); the
training loop asks :meth:`StopSignals.agreed` at every step boundary, one all-reduce of the flag
over the CPU group, so every rank stops after the same step even when the signal reached one
rank first, and the loop saves a checkpoint there. A second signal restores the default action
and re-sends itself: the process ends at once, without a save (``latest`` stays on the last
complete checkpoint, as after ``kill -9``). A signal within :data:`REPEAT_S` of the first counts as
the same request: Ctrl-C under the ``deepspeed`` launcher reaches each rank twice, once from the
terminal and once passed on by the launcher (SIGTERM), as ``scancel`` does through a launcher.

Limit: the launchers give their children a grace period before SIGKILL (the ``deepspeed``
launcher and torchrun 30 s): the step in progress and the save must fit in it.

Forked processes inherit the handlers; there they do nothing. DataLoader workers replace them
(torch's worker handler ends a worker on a SIGTERM from anyone but its parent), so the loader
ignores these signals in its workers (``pipeline.data.loader``): a signal sent to the whole process group
(SLURM does; so does Ctrl-C in a terminal) does not kill a worker under the stopping run, which ends
its workers itself. Handlers can only be installed from the main thread; elsewhere (a run
started from a thread) the signals keep their previous handling, named in a warning.
"""

from __future__ import annotations

import logging
import os
import signal
import threading
import time
from typing import Any, Optional, Sequence

import torch
import torch.distributed as dist

from ..config import STOP_SIGNALS
from ..engine.dist import cpu_group, world

__all__ = ["StopSignals", "STOP_SIGNALS", "REPEAT_S"]

logger = logging.getLogger(__name__)

#: Seconds after the first stop signal within which another one is the same request passed on again.
REPEAT_S = 1.0

class StopSignals:
    """A context manager: the handlers are installed inside and the previous ones restored after."""

    def __init__(self, names: Sequence[str]) -> None:
        self.signals = [signal.Signals[name] for name in names]
        self.received: Optional[str] = None
        """The first signal this process received (its name)."""
        self.stopped_by: Optional[str] = None
        """Why the run stopped once :meth:`agreed` said so: the signal's name, or ``"a signal to
        another rank"``."""
        self._pid = os.getpid()
        self._previous: dict = {}
        self._group: Any = None
        self._first_at = 0.0

    def __enter__(self) -> "StopSignals":
        if not self.signals:
            return self
        if threading.current_thread() is not threading.main_thread():
            logger.warning("train.save_on_signal: the run is not in the main thread, where signal handlers live: "
                           "%s keep their usual effect", ", ".join(s.name for s in self.signals))
            return self
        for sig in self.signals:
            self._previous[sig] = signal.signal(sig, self._handle)
        if world()[1] > 1:
            self._group = cpu_group()  # made now, by every rank at the same point
        return self

    def __exit__(self, *exc: Any) -> None:
        for sig, previous in self._previous.items():
            signal.signal(sig, previous)
        self._previous.clear()

    def _handle(self, signum: int, frame: Any) -> None:
        if os.getpid() != self._pid:
            return  # a forked loader worker: the main process ends it with the run
        name = signal.Signals(signum).name
        if self.received is None:
            self.received, self._first_at = name, time.monotonic()
            os.write(2, f"[rank{world()[0]}] received {name}: the run stops after this step, with a checkpoint "
                        f"(send {name} again to stop at once, without one)\n".encode())
            return
        if time.monotonic() - self._first_at < REPEAT_S:
            return  # the same request, delivered again
        os.write(2, f"[rank{world()[0]}] second {name}: stopping at once, without a checkpoint\n".encode())
        signal.signal(signum, signal.SIG_DFL)
        os.kill(os.getpid(), signum)

    def agreed(self) -> bool:
        """Whether any rank received a stop signal (every rank gets the same answer: one
        all-reduce over the CPU group, when there is more than one rank)."""
        if not self._previous:
            return False
        mine = self.received is not None
        if self._group is not None:
            flag = torch.tensor([1 if mine else 0], dtype=torch.int32)
            dist.all_reduce(flag, op=dist.ReduceOp.MAX, group=self._group)
            anyone = bool(flag.item())
        else:
            anyone = mine
        if anyone and self.stopped_by is None:
            self.stopped_by = self.received or "a signal to another rank"
        return anyone
