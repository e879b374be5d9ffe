"""Test-wide setup. Triton reads TRITON_INTERPRET when kernels are defined, so without a GPU it
must be set before `ops` is imported (tests/run.sh sets it too).

The cyclic garbage collector is kept off what the suite has already built: after collection and
after each test module, one collection, then ``gc.freeze()`` moves every surviving object (the
imported libraries, session fixtures, dynamo's caches: about 1.5 million objects by the end of the
default run) out of its sweep. Without this, every full collection walks them all, and DeepSpeed
calls ``gc.collect()`` for each ZeRO-3 engine it builds (``zero.utils.defragment``): about 0.7 s an
engine in a full run, a minute over the suite. Only the objects a module leaves alive are frozen;
what they free later is still freed by reference counting, but a reference cycle among them that
is dropped later stays (its finalizers unrun) until the session's end, and so does a cycle that
runs through one of them. Nothing is frozen while a module runs, so the cycles a test makes among
its own objects are collected as usual. At the session's end the frozen ones are handed back
(``gc.unfreeze()``), so that the interpreter's exit collects them as usual (nanobind, under
Triton, reports the objects it finds alive then as leaks)."""

import gc
import os

import pytest

try:
    import torch

    _cuda = torch.cuda.is_available()
except ImportError:  # pragma: no cover
    _cuda = False
if not _cuda:
    os.environ.setdefault("TRITON_INTERPRET", "1")


def _freeze_survivors() -> None:
    gc.collect()
    gc.freeze()


def pytest_collection_finish(session):
    _freeze_survivors()


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_protocol(item, nextitem):
    yield  # the module's fixtures are torn down in its last test's teardown, inside this call
    if nextitem is None or getattr(nextitem, "module", None) is not getattr(item, "module", None):
        _freeze_survivors()


def pytest_unconfigure(config):
    gc.unfreeze()
