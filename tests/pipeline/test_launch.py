"""launch/pretrain.py without a launcher, and the multi-node launch paths (slow).

The plain ``python launch/pretrain.py`` run (one process, single-process env defaults filled in)
is in the default suite; the hostfile (two simulated nodes on this machine, ``--no_ssh``) and
``--launcher openmpi`` runs are ``slow`` (the latter also needs ``mpirun`` and mpi4py's MPI).
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import time

import pytest

from infclip.pipeline.train.checkpoint import read_latest

from .test_train import LAUNCH, ROOT, TINY, base_overrides, free_port, tb_scalars


def _env():
    env = dict(os.environ, OMP_NUM_THREADS="1", TOKENIZERS_PARALLELISM="false", PYTHONPATH=ROOT)
    for key in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT"):
        env.pop(key, None)  # a test in this process may have set them; the child must start clean
    return env


def _sets(overrides):
    out = []
    for item in overrides:
        out += ["--set", item]
    return out


_EXIT_RANK = """
import atexit, ctypes, datetime, logging, logging.handlers, sys
import torch, torch.distributed as dist
from infclip.pipeline.engine.dist import exit_process
rank, port, log_file = int(sys.argv[1]), sys.argv[2], sys.argv[3]
dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=2,
                        timeout=datetime.timedelta(seconds=60))
total = torch.full((1 << 12,), rank + 1.0)
total.note = "a Python attribute: the tensor's Python object outlives Python's own reference"
dist.all_reduce(total)
handler = logging.handlers.MemoryHandler(capacity=1000, target=logging.FileHandler(log_file))
logging.getLogger().addHandler(handler)  # holds its records until flushed or closed
logging.getLogger("exit").warning("rank %d logged", rank)
print(f"rank {rank} sum {total[0].item():g}", end="")  # no newline, stdout a pipe: still buffered
ctypes.CDLL(None).printf(b" and C")  # C's stdio buffer, flushed after Python's
atexit.register(lambda: open(log_file + ".atexit", "w").close())
del total
exit_process(3 + rank)
"""


def test_exit_process_leaves_with_its_code_after_flushing_logs_and_stdout(tmp_path):
    """pipeline.engine.dist.exit_process, as launch/pretrain.py leaves: two gloo ranks after an all-reduce
    (the group's worker threads alive) each end with the code given, after their atexit handlers,
    and what they had buffered (a log record in a MemoryHandler, text in Python's block-buffered
    stdout and in C's) is written first.
    (The abort it guards against is a race at finalization that no test here reproduces.)"""
    port = str(free_port())
    env = {k: v for k, v in _env().items() if k != "PYTHONUNBUFFERED"}
    procs = [subprocess.Popen([sys.executable, "-c", _EXIT_RANK, str(rank), port, str(tmp_path / f"rank{rank}.log")],
                              env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
             for rank in range(2)]
    try:
        for rank, proc in enumerate(procs):
            out, err = proc.communicate(timeout=180)
            assert proc.returncode == 3 + rank, (proc.returncode, out, err[-3000:])
            assert out == f"rank {rank} sum 3 and C", (out, err[-3000:])
            assert (tmp_path / f"rank{rank}.log").read_text() == f"rank {rank} logged\n"
            assert (tmp_path / f"rank{rank}.log.atexit").is_file()
    finally:
        for proc in procs:
            proc.kill()
            proc.wait()


def test_plain_python_single_process(digits_shards, tmp_path):
    """No launcher; DeepSpeed's TensorBoard section on: it names the folder of the run's one writer.
    A fresh torch extensions folder holding a stale lock of the shm op (a killed build): the run
    neither builds that op (~35 s) nor waits on the lock, and names the lock."""
    out, tb = tmp_path / "run", tmp_path / "tb_ds"
    ext = tmp_path / "torch_extensions"
    lock = ext / "deepspeed_shm_comm" / "lock"
    lock.parent.mkdir(parents=True)
    lock.write_text("")
    os.utime(lock, (time.time() - 3600, time.time() - 3600))
    monitor = {"tensorboard": {"enabled": True, "output_path": str(tb), "job_name": "job"}}
    # --deepspeed: DeepSpeed's documented switch (argparse once took it for --deepspeed_config)
    cmd = [sys.executable, LAUNCH, "--deepspeed", "--deepspeed_config", TINY,
           *_sets(base_overrides(digits_shards, out, 4, **monitor))]
    proc = subprocess.run(cmd, cwd=str(tmp_path), env=dict(_env(), TORCH_EXTENSIONS_DIR=str(ext)),
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert f"stale torch extension build lock {lock}" in proc.stderr
    assert sorted(os.listdir(ext)) == ["deepspeed_shm_comm"] and os.listdir(ext / "deepspeed_shm_comm") == ["lock"]
    assert sorted(tb_scalars(out, tb=tb / "job")) == [1, 2, 3, 4]
    # one writer per run: DeepSpeed's section says where; its own monitor (Train/Samples/...) is not started
    assert not tb_scalars(out, "Train/Samples/lr", tb=tb / "job")
    assert len([f for f in os.listdir(tb / "job") if f.startswith("events.out.tfevents")]) == 1
    assert read_latest(str(out / "ckpt")) == "global_step4"
    assert "step 4/4" in proc.stderr + proc.stdout  # the rank-0 progress line


def _one_line_error(proc, prog):
    """The process failed with exit code 2 and one ``prog: error: ...`` line, no traceback."""
    assert proc.returncode == 2, (proc.returncode, proc.stderr[-3000:])
    assert "Traceback" not in proc.stderr, proc.stderr[-3000:]
    errors = [line for line in proc.stderr.splitlines() if line.startswith(f"{prog}: error: ")]
    assert len(errors) == 1, proc.stderr[-3000:]
    return errors[0]


def test_bad_key_fails_before_any_work(tmp_path):
    cmd = [sys.executable, LAUNCH, "--ds_config", TINY, "--set", "zero_optimisation.stage=2"]
    proc = subprocess.run(cmd, cwd=str(tmp_path), env=_env(), capture_output=True, text=True, timeout=120)
    line = _one_line_error(proc, "pretrain.py")
    assert "unknown top-level key 'zero_optimisation'" in line and TINY in line
    assert "did you mean 'zero_optimization'" in line
    assert not (tmp_path / "runs").exists()
    proc = subprocess.run(cmd + ["--debug"], cwd=str(tmp_path), env=_env(), capture_output=True, text=True,
                          timeout=120)
    assert proc.returncode != 0 and "Traceback" in proc.stderr and "ConfigError" in proc.stderr


def test_half_written_checkpoint_is_one_line_in_pretrain_and_zeroshot(digits_shards, tmp_path):
    """--resume of a tag whose save died (zero-byte model states, no manifest), and zeroshot of it."""
    tag = tmp_path / "run" / "ckpt" / "global_step2"
    tag.mkdir(parents=True)
    (tag / "mp_rank_00_model_states.pt").write_bytes(b"")
    (tmp_path / "run" / "ckpt" / "latest").write_text("global_step2")
    cmd = [sys.executable, LAUNCH, "--ds_config", TINY, "--resume", "latest",
           *_sets(base_overrides(digits_shards, tmp_path / "run", 4))]
    proc = subprocess.run(cmd, cwd=str(tmp_path), env=_env(), capture_output=True, text=True, timeout=300)
    line = _one_line_error(proc, "pretrain.py")
    assert f"checkpoint {tag} is incomplete: no manifest.json" in line and "empty: mp_rank_00_model_states.pt" in line
    zeroshot = os.path.join(ROOT, "launch", "zeroshot.py")
    proc = subprocess.run([sys.executable, zeroshot, "--checkpoint", str(tmp_path / "run")], cwd=str(tmp_path),
                          env=_env(), capture_output=True, text=True, timeout=300)
    line = _one_line_error(proc, "zeroshot.py")
    assert str(tag) in line and "mp_rank_00_model_states.pt" in line


def test_make_shards_bad_input_is_one_line(tmp_path):
    script = os.path.join(ROOT, "launch", "make_shards.py")
    proc = subprocess.run([sys.executable, script, "--image-dir", str(tmp_path / "nope"), "--out", str(tmp_path / "o")],
                          cwd=str(tmp_path), env=_env(), capture_output=True, text=True, timeout=120)
    assert "image folder not found" in _one_line_error(proc, "make_shards.py")


@pytest.mark.slow
def test_two_simulated_nodes_with_a_hostfile(digits_shards, tmp_path):
    """Two `deepspeed --hostfile --no_ssh --node_rank N` processes on this machine form one world."""
    hostfile = tmp_path / "hostfile"
    hostfile.write_text("nodeA slots=1\nnodeB slots=1\n")
    out = tmp_path / "run"
    port = str(free_port())
    procs = []
    for node_rank in (0, 1):
        cmd = [sys.executable, "-m", "deepspeed.launcher.runner", "--hostfile", str(hostfile), "--no_ssh",
               "--node_rank", str(node_rank), "--master_addr", "127.0.0.1", "--master_port", port,
               LAUNCH, "--ds_config", TINY, *_sets(base_overrides(digits_shards, out, 4, **{"zero_optimization.stage": 3}))]
        procs.append(subprocess.Popen(cmd, cwd=str(tmp_path), env=_env(), stdout=subprocess.PIPE,
                                      stderr=subprocess.STDOUT, text=True))
    logs = [p.communicate(timeout=400)[0] for p in procs]
    assert all(p.returncode == 0 for p in procs), "\n".join(log[-3000:] for log in logs)
    assert sorted(tb_scalars(out)) == [1, 2, 3, 4]
    assert (out / "ckpt" / "global_step4" / "rng_rank1.pt").is_file()  # two ranks took part


@pytest.mark.slow
def test_openmpi_launcher(digits_shards, tmp_path):
    if shutil.which("mpirun") is None:
        pytest.skip("mpirun not installed (apt-get install openmpi-bin libopenmpi-dev)")
    pytest.importorskip("mpi4py.MPI")
    hostfile = tmp_path / "hostfile"
    hostfile.write_text("localhost slots=2\n")
    out = tmp_path / "run"
    cmd = [sys.executable, "-m", "deepspeed.launcher.runner", "--hostfile", str(hostfile), "--force_multi",
           "--no_ssh_check", "--launcher", "openmpi", "--launcher_args", "--allow-run-as-root --mca btl_tcp_if_include lo",
           "--master_addr", "127.0.0.1", "--master_port", str(free_port()),
           LAUNCH, "--ds_config", TINY, *_sets(base_overrides(digits_shards, out, 4))]
    proc = subprocess.run(cmd, cwd=str(tmp_path), env=_env(), capture_output=True, text=True, timeout=400)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert sorted(tb_scalars(out)) == [1, 2, 3, 4]
    assert (out / "ckpt" / "global_step4" / "rng_rank1.pt").is_file()


def test_two_ranks_stop_together_when_rank_0_fails_first(digits_shards, tmp_path):
    """Rank 0 fails inside "rank 0 first" (its shards are missing): rank 1, waiting for it, stops
    too with one line naming rank 0, instead of waiting forever; the launcher exits non-zero."""
    missing = os.path.join(digits_shards["dir"], "gone-{000000..000001}.tar")
    cmd = [sys.executable, "-m", "deepspeed.launcher.runner", "--num_gpus", "2", "--master_port", str(free_port()),
           LAUNCH, "--ds_config", TINY, *_sets(base_overrides(digits_shards, tmp_path / "run", 2,
                                                              **{"data.train_shards": missing}))]
    proc = subprocess.run(cmd, cwd=str(tmp_path), env=_env(), capture_output=True, text=True, timeout=300)
    out = proc.stdout + proc.stderr
    assert proc.returncode != 0 and "Traceback" not in out, out[-3000:]
    errors = [line for line in out.splitlines() if "pretrain.py: error: " in line]
    assert len(errors) == 2, out[-3000:]
    assert any("2 of 2 shard file(s) not found" in line and "gone-000000.tar" in line for line in errors)
    assert any("rank 0 failed during data and tokenizer preparation" in line for line in errors)
