"""Hardening, with real files: planted pickles in every checkpoint file the resume path
reads, half-written tags, stale incomplete tags and keep_last, a resume with another setup, a
non-finite gradient norm. In-process runs on a gloo world of one (tests/pipeline/test_train.py)."""

from __future__ import annotations

import json
import math
import os
import shutil

import pytest
import torch

from infclip.eval.checkpoint import load_model
from infclip.ops import ContrastiveLoss
from infclip.pipeline.errors import CheckpointError, NonFiniteGradError, ResumeMismatchError
from infclip.pipeline.train.checkpoint import MANIFEST, check_tag, list_tags, read_latest
from infclip.pipeline.train.run_state import Checkpointer

from .test_train import run_inproc, tb_scalars, world_of_one  # noqa: F401  (fixture)


class _Payload:
    """Unpickling this creates a directory: proof that a loader ran code from the file."""

    def __init__(self, path):
        self.path = str(path)

    def __reduce__(self):
        return (os.mkdir, (self.path,))


@pytest.fixture(scope="module")
def zero1_run(world_of_one, digits_shards, tmp_path_factory):  # noqa: F811
    """ZeRO-1 (optimizer states in their own file), 4 steps, a checkpoint every 2, keep 2; before
    it starts, the checkpoint folder holds two incomplete tags of an earlier crashed run."""
    out = tmp_path_factory.mktemp("z1") / "run"
    stale_new, stale_old = out / "ckpt" / "global_step99", out / "ckpt" / "global_step1"
    for stale in (stale_new, stale_old):
        stale.mkdir(parents=True)
        (stale / "mp_rank_00_model_states.pt").write_bytes(b"")
    result = run_inproc(digits_shards, out, 4, **{"train.save_every": 2, "zero_optimization.stage": 1})
    return out, result


def _copy_ckpt(run, dest):
    shutil.copytree(run / "ckpt", dest / "ckpt")
    return dest / "ckpt", dest / "ckpt" / "global_step4"


def _refresh_manifest(tag_dir):
    """What an attacker who rewrote a file would also do: make the manifest match again."""
    manifest = json.loads((tag_dir / MANIFEST).read_text())
    manifest["files"] = {p.name: p.stat().st_size for p in tag_dir.iterdir() if p.is_file() and p.name != MANIFEST}
    (tag_dir / MANIFEST).write_text(json.dumps(manifest))


def test_incomplete_tags_are_not_counted_nor_kept(zero1_run):
    out, result = zero1_run
    ckpt = out / "ckpt"
    assert sorted(result.losses) == [1, 2, 3, 4]
    assert read_latest(ckpt) == "global_step4"
    # keep_last_checkpoints = 2 counts complete tags only: 2 and 4 stay, the stale ones are gone
    assert list_tags(ckpt) == ["global_step2", "global_step4"]
    for tag in ("global_step2", "global_step4"):
        manifest = check_tag(ckpt / tag)
        assert {"mp_rank_00_model_states.pt", "zero_pp_rank_0_mp_rank_00_optim_states.pt",
                "rng_rank0.pt"} <= set(manifest["files"])


@pytest.mark.parametrize("target", ["model", "optimizer", "rng", "client_state"])
def test_planted_pickle_never_runs_on_resume(zero1_run, digits_shards, tmp_path, target):
    out, _ = zero1_run
    ckpt, tag = _copy_ckpt(out, tmp_path)
    probe = tmp_path / "code_ran"
    name = {"model": "mp_rank_00_model_states.pt", "optimizer": "zero_pp_rank_0_mp_rank_00_optim_states.pt",
            "rng": "rng_rank0.pt", "client_state": "mp_rank_00_model_states.pt"}[target]
    if target == "client_state":  # a valid model-state file whose client entry is the payload
        states = torch.load(tag / name, weights_only=True, map_location="cpu")
        states["step"] = _Payload(probe)
        torch.save(states, tag / name)
    else:
        torch.save({"payload": _Payload(probe)}, tag / name)
    _refresh_manifest(tag)
    with pytest.raises(CheckpointError, match=rf"refused to load .*{name}.*posix\.mkdir"):
        run_inproc(digits_shards, tmp_path, 6, resume=str(ckpt), **{"train.save_every": 2,
                                                                   "zero_optimization.stage": 1})
    assert not probe.exists()
    if target == "model":  # eval's loader (launch/zeroshot.py) refuses it too
        with pytest.raises(CheckpointError, match=rf"refused to load .*{name}"):
            load_model(ckpt, config=out / "config.json", tokenizer=digits_shards["tokenizer_dir"])
        assert not probe.exists()
    torch.load(tag / name, weights_only=False)  # the payload is live: a full unpickle runs it
    assert probe.is_dir()


def test_half_written_tag_is_named(zero1_run, digits_shards, tmp_path):
    out, _ = zero1_run
    ckpt, tag = _copy_ckpt(out, tmp_path)
    sets = {"train.save_every": 2, "zero_optimization.stage": 1}
    (tag / "zero_pp_rank_0_mp_rank_00_optim_states.pt").write_bytes(b"")  # cut to zero by a crash
    with pytest.raises(CheckpointError, match=r"global_step4 is damaged: zero_pp_rank_0_mp_rank_00_optim_states"
                                              r"\.pt is empty \(0 of \d+ bytes\)"):
        run_inproc(digits_shards, tmp_path, 6, resume=str(tag), **sets)
    (tag / MANIFEST).unlink()  # the save never got to its manifest
    with pytest.raises(CheckpointError, match=r"global_step4 is incomplete: no manifest\.json .*empty: "
                                              r"zero_pp_rank_0_mp_rank_00_optim_states\.pt"):
        run_inproc(digits_shards, tmp_path, 6, resume=str(tag), **sets)
    with pytest.raises(CheckpointError, match=r"global_step4 is incomplete"):  # eval names it too
        load_model(tag, config=out / "config.json", tokenizer=digits_shards["tokenizer_dir"])
    model_file = tag / "mp_rank_00_model_states.pt"
    model_file.write_bytes(model_file.read_bytes()[:1000])  # truncated, with a manifest that says so
    (tag / "zero_pp_rank_0_mp_rank_00_optim_states.pt").unlink()
    shutil.copy(out / "ckpt" / "global_step4" / MANIFEST, tag / MANIFEST)
    with pytest.raises(CheckpointError, match=r"mp_rank_00_model_states\.pt has 1000 bytes, \d+ were written; "
                                              r"zero_pp_rank_0_mp_rank_00_optim_states\.pt is missing"):
        run_inproc(digits_shards, tmp_path, 6, resume=str(tag), **sets)


def test_resume_with_another_setup_is_refused(zero1_run, digits_shards, tmp_path):
    out, _ = zero1_run
    ckpt, _ = _copy_ckpt(out, tmp_path)
    fewer = digits_shards["train"].replace("{000000..000007}", "{000000..000005}")
    assert fewer != digits_shards["train"]
    with pytest.raises(ResumeMismatchError) as exc:
        run_inproc(digits_shards, tmp_path, 6, resume="latest", **{
            "train.save_every": 2, "zero_optimization.stage": 1, "train_micro_batch_size_per_gpu": 16,
            "data.seed": 5, "data.train_shards": fewer})
    msg = str(exc.value)
    assert "micro-batch (train_micro_batch_size_per_gpu) 32 -> 16" in msg and "data.seed 0 -> 5" in msg
    assert "data sources (data.train_shards) '8 shard(s)" in msg and "-> '6 shard(s)" in msg
    assert "world size" not in msg and "train.seed" not in msg  # only what changed is listed
    # the same setup resumes (and finishes the run where the uninterrupted one would)
    result = run_inproc(digits_shards, tmp_path, 5, resume="latest", **{"train.save_every": 2,
                                                                        "zero_optimization.stage": 1})
    assert sorted(result.losses) == [5]


def test_world_size_change_is_named(tmp_path):
    """The data-parallel world size cannot change in one process: the comparison itself."""
    from infclip.pipeline.config import load_config

    from .test_train import TINY
    cfg = load_config(TINY, [f"train.output_dir={tmp_path}"])
    old = {"micro_batch": 64, "world_size": 2, "data_seed": 0}  # a client state from before data_setup
    with pytest.raises(ResumeMismatchError, match=r"data-parallel world size 2 -> 1"):
        Checkpointer(cfg, {"micro_batch": 64, "world_size": 1, "data_seed": 0})._check_setup(old, "x")


class _InfiniteGradient(torch.autograd.Function):
    """The loss as it is, its gradient times inf: a finite loss whose gradients are not finite (as
    an overflow in a backward gives them; the loss op itself returns a NaN loss for scales large
    enough to overflow its gradients)."""

    @staticmethod
    def forward(ctx, loss):
        return loss.clone()

    @staticmethod
    def backward(ctx, grad):
        return grad * math.inf


@pytest.mark.parametrize("stage, log_every, save_every", [(0, 1, 1), (1, 4, 0)])
def test_non_finite_gradient_norm_stops_the_run(monkeypatch, world_of_one, digits_shards,  # noqa: F811
                                                tmp_path, stage, log_every, save_every):
    """A finite first loss with non-finite gradients (_InfiniteGradient on the loss). ZeRO-0 (our
    norm of the reduced gradients) and ZeRO-1 (DeepSpeed's norm) both name step 1, also when the
    check comes at a later log step (the later non-finite loss is traced back to it), and nothing
    is saved or logged after it."""
    forward = ContrastiveLoss.forward
    monkeypatch.setattr(ContrastiveLoss, "forward",
                        lambda self, *args, **kw: _InfiniteGradient.apply(forward(self, *args, **kw)))
    with pytest.raises(NonFiniteGradError, match=r"non-finite gradient norm \((inf|nan)\) at step 1: "):
        run_inproc(digits_shards, tmp_path / "run", 6, **{"zero_optimization.stage": stage,
                                                            "train.log_every": log_every,
                                                            "train.save_every": save_every})
    assert read_latest(tmp_path / "run" / "ckpt") is None
    assert not os.path.exists(tmp_path / "run" / "tb") or not tb_scalars(tmp_path / "run")


@pytest.mark.slow
def test_kill_9_then_resume_repeats_the_uninterrupted_losses(digits_shards, tmp_path):
    """A real SIGKILL of launch/pretrain.py while it checkpoints every step: ``latest`` names a
    complete tag, and the run resumed from it logs the uninterrupted run's losses, bitwise."""
    import signal
    import subprocess
    import sys
    import time

    from .test_launch import _env, _sets
    from .test_train import LAUNCH, TINY, base_overrides, tb_scalars

    steps, extra = 12, {"train.save_every": 1, "model.vision.attention_dropout": 0.1}

    def cmd(out, *args):
        return [sys.executable, LAUNCH, "--ds_config", TINY, *args, *_sets(base_overrides(digits_shards, out, steps,
                                                                                           **extra))]

    full = tmp_path / "full"
    proc = subprocess.run(cmd(full), cwd=str(tmp_path), env=_env(), capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    killed = tmp_path / "killed"
    child = subprocess.Popen(cmd(killed), cwd=str(tmp_path), env=_env(), stdout=subprocess.DEVNULL,
                             stderr=subprocess.DEVNULL)
    deadline = time.time() + 240
    while int((read_latest(killed / "ckpt") or "global_step0").removeprefix("global_step")) < 4 \
            and time.time() < deadline:
        time.sleep(0.01)  # the kill then lands within a step or its save
    child.send_signal(signal.SIGKILL)
    child.wait(timeout=60)
    tag = read_latest(killed / "ckpt")
    assert tag is not None and child.returncode == -signal.SIGKILL
    check_tag(killed / "ckpt" / tag)
    at = int(tag.removeprefix("global_step"))
    assert at < steps, "the run ended before the kill"
    resumed = tmp_path / "resumed"
    proc = subprocess.run(cmd(resumed, "--resume", str(killed / "ckpt")), cwd=str(tmp_path), env=_env(),
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    want, got = tb_scalars(full), tb_scalars(resumed)
    assert sorted(got) == list(range(at + 1, steps + 1))
    for step, value in got.items():
        assert value == want[step], (step, value, want[step])


def test_deepspeed_section_error_is_one_config_error(world_of_one, digits_shards, tmp_path):  # noqa: F811
    """A misspelt key inside a DeepSpeed section: DeepSpeed's pydantic error (a screen long)
    becomes one ConfigError naming the file and the key."""
    from infclip.ops.config import ConfigError

    with pytest.raises(ConfigError, match=r"tiny_cpu\.json: DeepSpeed rejected the config: .*stagee") as exc:
        run_inproc(digits_shards, tmp_path, 2, **{"zero_optimization.stagee": 2})
    assert "\n" not in str(exc.value)


def test_deepspeed_batch_arithmetic_is_one_config_error(world_of_one, digits_shards, tmp_path):  # noqa: F811
    """train_batch_size that is not micro-batch x accumulation x world: DeepSpeed's assert in its
    config module becomes a ConfigError naming the file."""
    from infclip.ops.config import ConfigError

    with pytest.raises(ConfigError, match=r"tiny_cpu\.json: DeepSpeed rejected the config: .*train_batch_size"):
        run_inproc(digits_shards, tmp_path, 2, **{"train_batch_size": 48})


def test_resume_into_another_model_size_is_named(zero1_run, digits_shards, tmp_path):
    out, _ = zero1_run
    ckpt, tag = _copy_ckpt(out, tmp_path)
    with pytest.raises(CheckpointError, match=r"global_step4 does not fit the model the config builds .*size "
                                              r"mismatch"):
        run_inproc(digits_shards, tmp_path, 6, resume=str(ckpt), **{"zero_optimization.stage": 1,
                                                                   "model.embed_dim": 32})
