"""Restarts and pre-emption: a run folder belongs to one run, resume never follows a bad ``latest``,
and a stop signal saves a checkpoint.

In-process runs on a gloo world of one (tests/pipeline/test_train.py); one six-step run (a
checkpoint every 2 steps, all kept) is the reference every case copies its folder from, and the
folder's contents are checked before and after each case: no complete tag lost, ``latest`` on a
complete tag. Real signals: to a child that installs the handlers (first and second signal, a
forked worker), to ``launch/pretrain.py`` (SIGINT), and (slow) SIGTERM to one of two ranks; an
unexpected failure of a launched run under loader workers ends it with exit code 1.
"""

from __future__ import annotations

import errno
import json
import os
import shutil
import signal
import socket
import subprocess
import sys

import pytest

from infclip.pipeline.errors import CheckpointError, RunFolderError
from infclip.pipeline.train.checkpoint import (MANIFEST, check_tag, latest_tag, list_tags, newest_checkpoint,
                                               read_latest, resolve_resume)
from infclip.pipeline.train.run_folder import LOCK_NAME, RunLock
from infclip.pipeline.train.run_state import Checkpointer, RunState

from .test_train import run_inproc, world_of_one  # noqa: F401  (fixture)

COMMON = {"train.save_every": 2, "train.keep_last_checkpoints": 0, "model.vision.attention_dropout": 0.1}


@pytest.fixture(scope="module")
def full_run(world_of_one, digits_shards, tmp_path_factory):  # noqa: F811
    """Six steps, checkpoints at 2, 4 and 6 (all kept): ``(run folder, {step: loss})``."""
    out = tmp_path_factory.mktemp("full") / "run"
    return out, run_inproc(digits_shards, out, 6, **COMMON).losses


def _stopped_at_4(full_out, dest):
    """``dest`` as the run would be had it stopped after its step-4 checkpoint."""
    shutil.copytree(full_out / "ckpt", dest / "ckpt", ignore=shutil.ignore_patterns("global_step6"))
    (dest / "ckpt" / "latest").write_text("global_step4")
    return dest / "ckpt"


def _contents(ckpt):
    return sorted(os.listdir(ckpt)), read_latest(ckpt)


def test_fresh_start_over_a_runs_checkpoints_is_refused(full_run, digits_shards, tmp_path):
    ckpt = _stopped_at_4(full_run[0], tmp_path / "run")
    before = _contents(ckpt)
    with pytest.raises(RunFolderError, match=r"holds the checkpoints of a run \(newest: global_step4\): continue it "
                                             r"with --resume latest, .*another train\.output_dir, or pass --overwrite"):
        run_inproc(digits_shards, tmp_path / "run", 2, **COMMON)
    other = full_run[0] / "ckpt" / "global_step2"  # a resume from another folder's checkpoint: the same
    with pytest.raises(RunFolderError, match="holds the checkpoints of a run"):
        run_inproc(digits_shards, tmp_path / "run", 4, resume=str(other), **COMMON)
    assert _contents(ckpt) == before and not (tmp_path / "run" / LOCK_NAME).exists()
    with pytest.raises(RunFolderError, match="--overwrite would delete the checkpoints --resume latest continues"):
        from infclip.pipeline.config import load_config
        from infclip.pipeline.train.train import train

        from .test_train import TINY, base_overrides
        train(load_config(TINY, base_overrides(digits_shards, tmp_path / "run", 2)), resume="latest", overwrite=True)
    # --overwrite: the earlier run's tags, latest and event files go, the new run's come
    (tmp_path / "run" / "tb").mkdir()
    (tmp_path / "run" / "tb" / "events.out.tfevents.old").write_text("")
    (tmp_path / "run" / "notes.txt").write_text("mine")
    from infclip.pipeline.config import load_config
    from infclip.pipeline.train.train import train

    from .test_train import TINY, base_overrides
    cfg = load_config(TINY, base_overrides(digits_shards, tmp_path / "run", 2, **COMMON))
    assert train(cfg, overwrite=True).step == 2
    assert _contents(ckpt) == (["global_step2", "latest"], "global_step2")
    assert not (tmp_path / "run" / "tb" / "events.out.tfevents.old").exists()
    assert (tmp_path / "run" / "notes.txt").read_text() == "mine"


@pytest.mark.parametrize("case", ["missing", "empty", "parent", "absolute", "symlink", "huge", "passwd", "damaged"])
def test_bad_latest_falls_back_to_the_newest_complete_tag(full_run, tmp_path, caplog, case):
    ckpt = _stopped_at_4(full_run[0], tmp_path / "run")
    outside = tmp_path / "other" / "ckpt" / "global_step8"
    shutil.copytree(ckpt / "global_step4", outside)
    latest = ckpt / "latest"
    if case == "missing":
        latest.unlink()
    elif case == "empty":
        latest.write_text("")
    elif case == "parent":
        latest.write_text("../../other/ckpt/global_step8")
    elif case == "absolute":
        latest.write_text(str(outside))
    elif case == "symlink":
        (ckpt / "global_step8").symlink_to(outside)
        latest.write_text("global_step8")
    elif case == "huge":
        latest.write_bytes(b"global_step4" * 5_000_000)  # 60 MB
    elif case == "passwd":
        latest.write_text("root:x:0:0:root:/root:/bin/bash\ndaemon:x:1:1:daemon:/usr/sbin:/usr/sbin/nologin\n")
    elif case == "damaged":  # latest on a tag whose manifest lists nothing
        (ckpt / "global_step4" / MANIFEST).write_text(json.dumps({"files": {}}))
    before = _contents(ckpt)
    assert read_latest(ckpt) == ("global_step4" if case == "damaged" else None)
    with caplog.at_level("WARNING"):
        assert resolve_resume("latest", ckpt) == (str(ckpt), "global_step2" if case == "damaged" else "global_step4")
    message = caplog.text
    assert "resuming from the newest complete checkpoint" in message and "nothing deleted" in message
    assert "root:x" not in message and len(message) < 2000
    assert _contents(ckpt) == before


def test_empty_manifest_is_not_complete(full_run, tmp_path):
    tag = tmp_path / "global_step4"
    shutil.copytree(full_run[0] / "ckpt" / "global_step4", tag)
    (tag / MANIFEST).write_text(json.dumps({"files": {}}))
    with pytest.raises(CheckpointError, match=r"lists no model-state file \(0 file\(s\) listed\)"):
        check_tag(tag)


def test_bad_latest_without_a_complete_tag_is_named(tmp_path):
    ckpt = tmp_path / "ckpt"
    (ckpt / "global_step2").mkdir(parents=True)  # an interrupted save
    (ckpt / "latest").write_text("/etc/passwd")
    with pytest.raises(CheckpointError, match=r"latest holds '/etc/passwd', not the name of a folder beside it; no "
                                              r"other complete checkpoint"):
        newest_checkpoint(ckpt)
    (ckpt / "latest").unlink()
    assert resolve_resume("latest", ckpt) is None  # a fresh start: the run never finished a save
    with pytest.raises(CheckpointError, match="no complete checkpoint there"):
        resolve_resume(str(ckpt), ckpt)
    assert latest_tag(ckpt) == (None, None) and os.path.isdir(ckpt / "global_step2")


def test_empty_latest_resumes_the_newest_tag_bitwise_and_deletes_nothing(full_run, digits_shards, tmp_path):
    """The run that said "no checkpoint, starting from step 0" and deleted its tags: now it resumes
    from global_step4, repeats steps 5-6 bit for bit, and keeps every tag (keep_last 0). A lock left
    by a killed run on this host (its pid gone) is taken over."""
    out = tmp_path / "run"
    ckpt = _stopped_at_4(full_run[0], out)
    (ckpt / "latest").write_text("")
    dead = subprocess.Popen(["true"])
    dead.wait()
    (out / LOCK_NAME).write_text(json.dumps({"host": socket.gethostname(), "pid": dead.pid, "start": "1"}))
    result = run_inproc(digits_shards, out, 6, resume="latest", **COMMON)
    assert sorted(result.losses) == [5, 6]
    for step in (5, 6):
        assert result.losses[step] == full_run[1][step], step
    assert _contents(ckpt) == (["global_step2", "global_step4", "global_step6", "latest"], "global_step6")
    assert not (out / LOCK_NAME).exists()


def test_resume_from_an_earlier_tag_sets_the_later_one_aside(full_run, digits_shards, tmp_path):
    out = tmp_path / "run"
    ckpt = _stopped_at_4(full_run[0], out)
    run_inproc(digits_shards, out, 4, resume=str(ckpt / "global_step2"), **COMMON)
    names, latest = _contents(ckpt)
    assert latest == "global_step4" and [n for n in names if n.startswith("global_step4.replaced-")]
    aside = next(n for n in names if n.startswith("global_step4.replaced-"))
    check_tag(ckpt / aside)  # the earlier run's step-4 checkpoint, whole
    assert list_tags(ckpt) == ["global_step2", "global_step4"]


def test_second_live_run_and_unusable_folders_are_refused(digits_shards, tmp_path):
    out = tmp_path / "run"
    out.mkdir()
    live = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        from infclip.pipeline.train.run_folder import _start_time

        (out / LOCK_NAME).write_text(json.dumps({"host": socket.gethostname(), "pid": live.pid,
                                                 "start": _start_time(live.pid), "since": "now"}))
        with pytest.raises(RunFolderError, match=rf"in use by a live run \(pid {live.pid} on this host"):
            RunLock(str(out)).acquire()
    finally:
        live.kill()
        live.wait()
    (out / LOCK_NAME).write_text(json.dumps({"host": "node-17", "pid": 4242, "since": "then"}))
    with pytest.raises(RunFolderError, match=rf"in use by pid 4242 on host node-17 .*delete {out / LOCK_NAME}"):
        RunLock(str(out)).acquire()
    (tmp_path / "file").write_text("")
    with pytest.raises(RunFolderError, match=r"train\.output_dir .*file is a file, not a folder"):
        run_inproc(digits_shards, tmp_path / "file", 2)


def test_full_disk_while_saving_names_the_step_and_latest(full_run, tmp_path):
    from infclip.pipeline.config import load_config

    from .test_train import TINY

    ckpt = _stopped_at_4(full_run[0], tmp_path / "run")

    class FullDisk:
        def save_checkpoint(self, save_dir, tag, **kwargs):
            raise OSError(errno.ENOSPC, "No space left on device",
                          os.path.join(save_dir, tag, "mp_rank_00_model_states.pt"))

    cfg = load_config(TINY, [f"train.output_dir={tmp_path / 'run'}"])
    with pytest.raises(CheckpointError, match=r"saving the checkpoint of step 6 in .* failed \(No space left on "
                                              r"device: .*global_step6/mp_rank_00_model_states\.pt\); latest "
                                              r"still names global_step4"):
        Checkpointer(cfg, {}).save(FullDisk(), RunState(step=6))
    assert read_latest(ckpt) == "global_step4" and list_tags(ckpt, complete_only=True)[-1] == "global_step4"


class _SignalAt:
    """An evaluator that sends this process ``sig`` at step ``step`` (a pre-emption mid-run)."""

    at_end = False

    def __init__(self, sig, step):
        self.sig, self.every = sig, step

    def __call__(self, model, step):
        os.kill(os.getpid(), self.sig)
        self.every = 0  # once
        return {}


def test_signal_stops_with_a_checkpoint_and_the_resume_is_bitwise(full_run, digits_shards, tmp_path):
    from infclip.pipeline.config import load_config
    from infclip.pipeline.train.train import train

    from .test_train import TINY, base_overrides

    out = tmp_path / "run"
    sets = base_overrides(digits_shards, out, 6, **{**COMMON, "train.save_every": 0})
    before = signal.getsignal(signal.SIGUSR1)
    result = train(load_config(TINY, sets), evaluator=_SignalAt(signal.SIGUSR1, 3))
    assert signal.getsignal(signal.SIGUSR1) is before  # the run's handlers are gone with it
    assert (result.stopped_by, result.step, sorted(result.losses)) == ("SIGUSR1", 3, [1, 2, 3])
    assert _contents(out / "ckpt") == (["global_step3", "latest"], "global_step3")
    check_tag(out / "ckpt" / "global_step3")
    resumed = train(load_config(TINY, sets), resume="latest")
    assert resumed.stopped_by is None and sorted(resumed.losses) == [4, 5, 6]
    for step in range(1, 7):
        assert {**result.losses, **resumed.losses}[step] == full_run[1][step], step


_TWO_SIGNALS = """
import os, signal, sys, time
from infclip.pipeline.train.signals import StopSignals
with StopSignals(["SIGTERM", "SIGINT"]) as stop:
    worker = os.fork()
    if worker == 0:  # a forked loader worker: the signal is the main process's business
        time.sleep(1.0)
        os._exit(7)
    os.kill(worker, signal.SIGTERM)
    print("worker", os.waitstatus_to_exitcode(os.waitpid(worker, 0)[1]), flush=True)
    os.kill(os.getpid(), signal.SIGTERM)
    time.sleep(0.2)
    os.kill(os.getpid(), signal.SIGINT)  # passed on by a launcher at once: the same request
    time.sleep(0.2)
    print("first", stop.received, stop.agreed(), flush=True)
    time.sleep(1.0)
    os.kill(os.getpid(), signal.SIGTERM)
    time.sleep(5)
    print("still running", flush=True)
"""


def test_first_signal_asks_the_second_ends_at_once_and_workers_ignore_them():
    from .test_launch import _env

    proc = subprocess.run([sys.executable, "-c", _TWO_SIGNALS], env=_env(), capture_output=True, text=True,
                          timeout=120)
    assert proc.returncode == -signal.SIGTERM, (proc.returncode, proc.stderr[-2000:])
    assert proc.stdout.splitlines() == ["worker 7", "first SIGTERM True"]
    assert "received SIGTERM: the run stops after this step, with a checkpoint" in proc.stderr
    assert "second SIGTERM: stopping at once, without a checkpoint" in proc.stderr


def _wait_for_tag(ckpt, step, procs, timeout=240):
    import time

    deadline = time.time() + timeout
    while int((read_latest(ckpt) or "global_step0").removeprefix("global_step")) < step:
        assert time.time() < deadline and all(p.poll() is None for p in procs), "the run ended or stalled"
        time.sleep(0.02)


def _stop_a_launched_run(digits_shards, tmp_path, name, steps, extra, group):
    """``launch/pretrain.py`` on the tiny config, stopped by signal ``name`` (to its whole process
    group with ``group``) once its step 2 is saved: exit code 0, no traceback, one stop line, a
    complete checkpoint of the step it names. Returns (command, run folder, stderr, that step)."""
    from .test_launch import _env, _sets
    from .test_train import LAUNCH, TINY, base_overrides

    out = tmp_path / "run"
    cmd = [sys.executable, LAUNCH, "--ds_config", TINY,
           *_sets(base_overrides(digits_shards, out, steps, **{"train.save_every": 2, **extra}))]
    proc = subprocess.Popen(cmd, cwd=str(tmp_path), env=_env(), stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True, start_new_session=group)
    try:
        _wait_for_tag(out / "ckpt", 2, [proc])
        if group:
            os.killpg(proc.pid, getattr(signal, name))
        else:
            proc.send_signal(getattr(signal, name))
        _, err = proc.communicate(timeout=120)
    finally:
        proc.kill()
    assert proc.returncode == 0, err[-3000:]
    assert "Traceback" not in err, err[-3000:]
    stops = [line for line in err.splitlines() if f"stopped by {name} after step" in line]
    assert len(stops) == 1 and "continue with --resume latest" in stops[0], err[-3000:]
    step = int(stops[0].split("after step ")[1].split(",")[0])
    assert read_latest(out / "ckpt") == f"global_step{step}" and step < steps
    check_tag(out / "ckpt" / f"global_step{step}")
    return cmd, out, err, step


def test_sigint_saves_and_exits_0_without_a_traceback_and_a_restart_is_refused(digits_shards, tmp_path):
    """Ctrl-C on a launched run: one line, exit code 0, a complete checkpoint of the step it was
    in; the same command again (no --resume) is refused in one line, the folder untouched."""
    from .test_launch import _env, _one_line_error

    cmd, out, err, step = _stop_a_launched_run(digits_shards, tmp_path, "SIGINT", 200, {}, group=False)
    assert "KeyboardInterrupt" not in err, err[-3000:]
    before = _contents(out / "ckpt")
    again = subprocess.run(cmd, cwd=str(tmp_path), env=_env(), capture_output=True, text=True, timeout=300)
    line = _one_line_error(again, "pretrain.py")
    assert f"holds the checkpoints of a run (newest: global_step{step}): continue it with --resume latest" in line
    assert _contents(out / "ckpt") == before and not (out / LOCK_NAME).exists()


def test_sigterm_to_the_process_group_stops_with_a_checkpoint_under_loader_workers(digits_shards, tmp_path):
    """SIGTERM to the run's whole process group (as SLURM sends it), loader workers included:
    the workers do not die under the run; it saves, says so in one line and exits 0."""
    _, _, err, _ = _stop_a_launched_run(digits_shards, tmp_path, "SIGTERM", 400, {"data.workers": 2}, group=True)
    assert "killed by signal" not in err, err[-3000:]


def _two_ranks(cmd, cwd, port):
    """Two ranks of one world started without a launcher, in one new process group (theirs and
    their loader workers')."""
    from .test_launch import _env

    procs = []
    for rank in (0, 1):
        env = dict(_env(), RANK=str(rank), LOCAL_RANK=str(rank), WORLD_SIZE="2", LOCAL_WORLD_SIZE="2",
                   MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
        group = procs[0].pid if procs else 0  # 0: a new group, named by rank 0's pid
        procs.append(subprocess.Popen(cmd, cwd=cwd, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                                      text=True, process_group=group))
    return procs


@pytest.mark.slow
def test_sigterm_to_one_of_two_ranks_stops_both_and_the_resume_is_bitwise(digits_shards, tmp_path):
    """SIGTERM reaches rank 1 only (two ranks, two loader workers each): both ranks stop after the
    same step with one checkpoint and exit 0, no loader worker outlives them, and the run resumed
    from that checkpoint logs the uninterrupted run's losses bit for bit."""
    from .test_launch import _sets
    from .test_train import LAUNCH, TINY, base_overrides, free_port, tb_scalars

    steps = 12
    extra = {"train.save_every": 2, "data.workers": 2, "model.vision.attention_dropout": 0.1}

    def run(out, *args, signal_rank1_after=None):
        cmd = [sys.executable, LAUNCH, "--ds_config", TINY, *args,
               *_sets(base_overrides(digits_shards, out, steps, **extra))]
        procs = _two_ranks(cmd, str(tmp_path), free_port())
        try:
            if signal_rank1_after is not None:
                _wait_for_tag(out / "ckpt", signal_rank1_after, procs)
                procs[1].send_signal(signal.SIGTERM)
            errs = [p.communicate(timeout=300)[1] for p in procs]
        finally:
            for p in procs:
                p.kill()
        assert [p.returncode for p in procs] == [0, 0], "\n".join(e[-3000:] for e in errs)
        return procs, errs

    run(tmp_path / "full")
    out = tmp_path / "stopped"
    procs, errs = run(out, signal_rank1_after=2)
    assert "received SIGTERM" in errs[1] and "received SIGTERM" not in errs[0]
    stop = [line for line in errs[0].splitlines() if "stopped by a signal to another rank after step" in line]
    assert len(stop) == 1, errs[0][-3000:]
    at = int(stop[0].split("after step ")[1].split(",")[0])
    assert 2 <= at < steps and read_latest(out / "ckpt") == f"global_step{at}"
    check_tag(out / "ckpt" / f"global_step{at}")
    assert (out / "ckpt" / f"global_step{at}" / "rng_rank1.pt").is_file()
    with pytest.raises(ProcessLookupError):  # nothing left of the ranks' process group: no worker
        os.killpg(procs[0].pid, 0)
    run(out, "--resume", "latest")
    want, got = tb_scalars(tmp_path / "full"), tb_scalars(out)
    assert sorted(got) == sorted(want) == list(range(1, steps + 1))
    for step in want:
        assert got[step] == want[step], (step, got[step], want[step])


@pytest.mark.slow
def test_ctrl_c_under_the_deepspeed_launcher_saves(digits_shards, tmp_path):
    """Ctrl-C reaches the launcher and both ranks (one process group); the launcher passes SIGTERM
    on at once. The ranks take the two as one request: they finish the step, save, and log the
    stop; the launcher itself exits 1 whatever its children did, and DeepSpeed's runner prints a
    KeyboardInterrupt traceback of its own."""
    from .test_launch import _env, _sets
    from .test_train import LAUNCH, TINY, base_overrides, free_port

    out = tmp_path / "run"
    cmd = [sys.executable, "-m", "deepspeed.launcher.runner", "--num_gpus", "2", "--master_port", str(free_port()),
           LAUNCH, "--ds_config", TINY, *_sets(base_overrides(digits_shards, out, 200, **{"train.save_every": 2}))]
    proc = subprocess.Popen(cmd, cwd=str(tmp_path), env=_env(), stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                            text=True, start_new_session=True)
    try:
        _wait_for_tag(out / "ckpt", 2, [proc])
        os.killpg(proc.pid, signal.SIGINT)
        log = proc.communicate(timeout=120)[0]
    finally:
        proc.kill()
    stops = [line for line in log.splitlines() if "stopped by SIGINT after step" in line]
    assert len(stops) == 1 and "second SIG" not in log, log[-4000:]
    # DeepSpeed's runner (the outer process) prints its own KeyboardInterrupt traceback; the ranks none
    frames = [line for line in log.splitlines() if line.strip().startswith('File "')]
    assert not [f for f in frames if "pretrain.py" in f or f"{os.sep}pipeline{os.sep}" in f], log[-4000:]
    step = int(stops[0].split("after step ")[1].split(",")[0])
    assert read_latest(out / "ckpt") == f"global_step{step}"
    check_tag(out / "ckpt" / f"global_step{step}")
    assert (out / "ckpt" / f"global_step{step}" / "rng_rank1.pt").is_file()


_FAILING_LAUNCH = """
import runpy, sys
from infclip.pipeline.train.loop import TrainLoop
step = TrainLoop._step
def failing(self):
    if self.state.step == 3:
        raise RuntimeError("injected failure in step 4")
    return step(self)
TrainLoop._step = failing
sys.argv = sys.argv[1:]
runpy.run_path(sys.argv[0], run_name="__main__")
"""


def test_a_failure_that_is_not_the_users_exits_1_with_its_traceback_under_loader_workers(digits_shards, tmp_path):
    """An unexpected error in a launched run with loader workers (which ignore the stop signals):
    its traceback, exit code 1, the checkpoint before it complete, and no process left waiting on
    the workers (``communicate``'s timeout would fire on such a hang)."""
    from .test_launch import _env, _sets
    from .test_train import LAUNCH, TINY, base_overrides

    out = tmp_path / "run"
    overrides = base_overrides(digits_shards, out, 50, **{"train.save_every": 2, "data.workers": 2})
    cmd = [sys.executable, "-c", _FAILING_LAUNCH, LAUNCH, "--ds_config", TINY, *_sets(overrides)]
    proc = subprocess.Popen(cmd, cwd=str(tmp_path), env=_env(), stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True, start_new_session=True)
    try:
        _, err = proc.communicate(timeout=240)
    finally:
        if proc.poll() is None:  # it hung: end it and whatever it started
            os.killpg(proc.pid, signal.SIGKILL)
    assert proc.returncode == 1, err[-3000:]
    assert "Traceback" in err and "RuntimeError: injected failure in step 4" in err, err[-3000:]
    assert read_latest(out / "ckpt") == "global_step2"
    check_tag(out / "ckpt" / "global_step2")
