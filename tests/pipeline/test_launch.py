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

import pytest

from pipeline.checkpoint import read_latest

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


def test_plain_python_single_process(digits_shards, tmp_path):
    """No launcher; DeepSpeed's own TensorBoard monitor section on: our scalars go beside its."""
    out, tb = tmp_path / "run", tmp_path / "tb_ds"
    monitor = {"tensorboard": {"enabled": True, "output_path": str(tb), "job_name": "job"}}
    cmd = [sys.executable, LAUNCH, "--ds_config", TINY, *_sets(base_overrides(digits_shards, out, 4, **monitor))]
    proc = subprocess.run(cmd, cwd=str(tmp_path), env=_env(), capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert sorted(tb_scalars(out, tb=tb / "job")) == [1, 2, 3, 4]
    assert tb_scalars(out, "Train/Samples/lr", tb=tb / "job")  # DeepSpeed's monitor wrote there too
    assert read_latest(str(out / "ckpt")) == "global_step4"
    assert "step 4/4" in proc.stderr + proc.stdout  # the rank-0 progress line


def test_bad_key_fails_before_any_work(tmp_path):
    cmd = [sys.executable, LAUNCH, "--ds_config", TINY, "--set", "zero_optimisation.stage=2"]
    proc = subprocess.run(cmd, cwd=str(tmp_path), env=_env(), capture_output=True, text=True, timeout=120)
    assert proc.returncode != 0
    assert "unknown top-level key 'zero_optimisation'" in proc.stderr and TINY in proc.stderr
    assert "did you mean 'zero_optimization'" in proc.stderr
    assert not (tmp_path / "runs").exists()


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
