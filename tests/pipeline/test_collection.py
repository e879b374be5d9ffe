"""pipeline.train.collection: automatic garbage collection off inside the block, the young generations
collected on the step schedule in the calling thread, the interpreter's state restored after."""

from __future__ import annotations

import gc
import threading

from infclip.pipeline.train.collection import StepCollection


def _watch():
    runs = []

    def note(phase, info):
        if phase == "stop":
            runs.append((info["generation"], threading.current_thread() is threading.main_thread()))

    gc.callbacks.append(note)
    return runs, note


def test_collection_runs_on_the_step_schedule_and_is_restored():
    assert gc.isenabled()
    runs, note = _watch()
    try:
        with StepCollection(3) as collection:
            assert not gc.isenabled() and gc.get_freeze_count() > 0
            start = len(runs)
            for _ in range(20000):  # cyclic garbage that automatic collection would have collected
                a = []
                a.append(a)
            assert len(runs) == start
            for step in range(1, 7):
                collection.after_step(step)
            assert runs[start:] == [(1, True), (1, True)]  # steps 3 and 6, the young generations, this thread
        assert gc.isenabled() and gc.get_freeze_count() == 0
    finally:
        gc.callbacks.remove(note)


def test_zero_leaves_automatic_collection_alone():
    with StepCollection(0) as collection:
        assert gc.isenabled() and gc.get_freeze_count() == 0
        collection.after_step(50)
    assert gc.isenabled()


def test_a_process_with_collection_off_keeps_it_off():
    gc.disable()
    try:
        with StepCollection(5):
            pass
        assert not gc.isenabled()
    finally:
        gc.enable()
