"""The interpreter's garbage collection during training: at step boundaries, not wherever it falls.

Design: Python's automatic collection runs in whichever thread crosses an allocation threshold and
holds the interpreter lock for the whole pass. In a training process that is often a loader thread
(the DataLoader's pin-memory thread, the GPU decode lanes, which make many short-lived objects a
batch), and then the training thread, which needs the lock between its kernel launches, stands
still while the GPU drains its queue. :class:`StepCollection` (``train.gc_every`` > 0) collects once
and freezes what exists when training starts (the model, the compiled graphs, the engine: never
garbage, and no longer scanned), turns automatic collection off, and collects the young
generations every ``gc_every`` optimizer steps in the training thread. When the loop ends, what was
frozen is unfrozen and automatic collection is restored as it was. torchtitan and Megatron-LM
collect on a step schedule for the same reason.
"""

from __future__ import annotations

import gc

__all__ = ["StepCollection"]


class StepCollection:
    """Garbage collection every ``every`` optimizer steps instead of the interpreter's automatic one,
    inside a ``with`` block (0: automatic collection, nothing changed)."""

    def __init__(self, every: int) -> None:
        self.every = int(every)
        self._took_over = False

    def __enter__(self) -> "StepCollection":
        if self.every > 0 and gc.isenabled():  # a process that turned it off itself keeps its own policy
            gc.collect()
            gc.freeze()
            gc.disable()
            self._took_over = True
        return self

    def after_step(self, step: int) -> None:
        """Collect the young generations when ``step`` is a multiple of ``every``."""
        if self.every > 0 and step % self.every == 0:
            gc.collect(1)

    def __exit__(self, *exc) -> None:
        if self._took_over:
            self._took_over = False
            gc.unfreeze()
            gc.enable()
