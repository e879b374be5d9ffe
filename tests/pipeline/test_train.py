"""End to end: real DeepSpeed launches on CPU (gloo), TensorBoard read back, checkpoints, resume.

The 2-process tests start ``deepspeed --num_gpus 2 launch/pretrain.py`` (two CPU ranks) on
real digits shards; the single-process tests call :func:`pipeline.train.train.train` in this process
(a gloo world of one) to keep the suite fast.
"""

from __future__ import annotations

import json
import math
import os
import re
import socket
import subprocess
import sys
import time

import pytest
import torch

from infclip.ops.config import ConfigError
from infclip.pipeline.config import load_config
from infclip.pipeline.train.checkpoint import list_tags, read_latest
from infclip.pipeline.train.train import NonFiniteLossError, train

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
TINY = os.path.join(ROOT, "ds_configs", "tiny_cpu.json")
LAUNCH = os.path.join(ROOT, "launch", "pretrain.py")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def base_overrides(shards, out_dir, steps, **extra) -> list[str]:
    sets = {
        "data.train_shards": shards["train"], "data.val_shards": None, "data.generate_digits": False,
        "data.tokenizer": shards["tokenizer_dir"], "data.workers": 0, "data.shuffle_buffer": 64,
        "model.text.context_length": 16, "train_micro_batch_size_per_gpu": 32,
        "optimizer.params.lr": 2e-3, "scheduler.params.warmup_num_steps": 20,
        "scheduler.params.total_num_steps": 100, "eval": None,
        "train.steps": steps, "train.log_every": 1, "train.output_dir": str(out_dir), "train.export_final": False,
    }
    sets.update(extra)
    return [f"{k}={json.dumps(v) if not isinstance(v, str) else v}" for k, v in sets.items()]


def tb_scalars(run_dir, tag="train/loss", tb=None) -> dict[int, float]:
    """``{step: value}`` of one scalar from the event files under ``tb`` (default run_dir/tb)."""
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    out = {}
    tb = str(tb) if tb is not None else os.path.join(run_dir, "tb")
    for sub in sorted(os.listdir(tb)):
        acc = EventAccumulator(os.path.join(tb, sub) if os.path.isdir(os.path.join(tb, sub)) else tb)
        acc.Reload()
        if tag in acc.Tags()["scalars"]:
            out.update({e.step: e.value for e in acc.Scalars(tag)})
    return out


def deepspeed_launch(overrides, cwd, extra_args=(), timeout=420):
    cmd = [sys.executable, "-m", "deepspeed.launcher.runner", "--num_gpus", "2", "--master_port", str(free_port()),
           LAUNCH, "--ds_config", TINY, *extra_args]
    for item in overrides:
        cmd += ["--set", item]
    env = dict(os.environ, OMP_NUM_THREADS="1", TOKENIZERS_PARALLELISM="false", PYTHONPATH=ROOT)
    proc = subprocess.run(cmd, cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout)
    assert proc.returncode == 0, f"launch failed ({proc.returncode}):\n{proc.stdout[-4000:]}\n{proc.stderr[-4000:]}"
    return proc


def mean(values):
    values = list(values)
    return sum(values) / len(values)


# ------------------------------------------------------------------------- real 2-process launches

STEPS = 100  # the tiny towers sit on the ln(B) plateau for ~40 steps, then learn


@pytest.fixture(scope="module")
def zero0_run(digits_shards, tmp_path_factory):
    """ZeRO-0, 2 ranks x 32 pairs, checkpoints at STEPS/2 and at the end."""
    out = tmp_path_factory.mktemp("z0") / "run"
    sets = base_overrides(digits_shards, out, STEPS, **{"train.save_every": STEPS // 2})
    deepspeed_launch(sets, cwd=str(out.parent))
    return out, sets


def test_two_process_zero0_trains_and_logs(zero0_run):
    out, _ = zero0_run
    losses = tb_scalars(out)
    assert sorted(losses) == list(range(1, STEPS + 1))
    chance = math.log(64)  # uniform over the global batch of 2 x 32
    first, last = mean(losses[s] for s in range(1, 11)), mean(losses[s] for s in range(STEPS - 9, STEPS + 1))
    # 100 steps: ~40 on the ln(B) plateau, then learning; the last 10 sit 0.5-0.6 below chance
    # (3.64-3.69 over runs), so 0.3 below is a clear learning signal with room for rounding
    assert last < min(first, chance) - 0.3, f"loss did not decrease: {first:.4f} -> {last:.4f} (chance {chance:.4f})"
    for tag in ("train/lr", "train/logit_scale", "train/grad_norm", "train/samples_per_s", "train/loss_op_ms",
                "train/peak_mem_gb", "data/skipped_samples", "data/images_per_s", "data/images_per_s_per_worker",
                "data/wait_fraction"):
        assert len(tb_scalars(out, tag)) == STEPS, tag
    rates, waits = tb_scalars(out, "data/images_per_s"), tb_scalars(out, "data/wait_fraction")
    assert all(0 < v < math.inf for v in rates.values()) and all(0 <= v <= 1 for v in waits.values())
    assert read_latest(str(out / "ckpt")) == f"global_step{STEPS}"
    assert list_tags(str(out / "ckpt")) == [f"global_step{STEPS // 2}", f"global_step{STEPS}"]
    tag_dir = out / "ckpt" / f"global_step{STEPS}"
    assert (tag_dir / "rng_rank0.pt").is_file() and (tag_dir / "rng_rank1.pt").is_file()


# zero3_init: 28 s on 2 cores, in the slow run (towers built partitioned are also tested against
# the whole build in tests/pipeline/test_zero3_init.py); the default run keeps the presets' layout
@pytest.mark.parametrize("flat", [pytest.param(False, marks=pytest.mark.slow), True, "tower"],
                         ids=["zero3_init", "flat_stack", "flat_tower"])
def test_two_process_zero3_chunked_ring_follows_zero0(zero0_run, digits_shards, tmp_path, flat):
    """ZeRO-3 + chunked backbone (3 chunks per micro-batch) + ring loss follow ZeRO-0 + one-graph
    backbone + gather loss (same data, same init): at step 1 (identical weights) the loss and the
    global gradient norm agree to float precision; the first updates give the same losses.
    Later steps drift apart: in Adam's first steps, elements whose gradient is rounding noise
    get +-lr updates, so differences of 1e-7 grow to 1e-3 within a few steps. Once with the towers
    built partitioned (zero3_init, each block a ZeRO-3 unit), once with flat per-block parameters
    partitioned by deepspeed.initialize and each tower's stack of blocks as the unit (views bound
    after the stack's gather, the stack called once per chunk; checkpoints and the export keep
    the usual names), once with flat towers, each tower the unit (its gradients reduced once per
    chunk's backward, none of DeepSpeed's host waits kept)."""
    z0, z0_norm = tb_scalars(zero0_run[0]), tb_scalars(zero0_run[0], "train/grad_norm")
    out = tmp_path / "run"
    steps = 3
    extra = ({"model.flat_parameters": flat, "model.zero3_init": False,
              "model.zero3_leaf_layers": "tower" if flat == "tower" else "stack"} if flat else {})
    sets = base_overrides(digits_shards, out, steps, **{"zero_optimization.stage": 3, "train.chunk_size": 12,
                                                         "contrastive_loss.distributed": "ring",
                                                         "train.export_final": True, **extra})
    deepspeed_launch(sets, cwd=str(tmp_path))
    losses, norms = tb_scalars(out), tb_scalars(out, "train/grad_norm")
    assert sorted(losses) == list(range(1, steps + 1))
    assert abs(losses[1] - z0[1]) < 1e-5 and abs(norms[1] - z0_norm[1]) < 1e-4 * z0_norm[1], \
        (losses[1], z0[1], norms[1], z0_norm[1])
    for step in (2, 3):
        assert abs(losses[step] - z0[step]) < 1e-4, (step, losses[step], z0[step])
    assert losses[2] != losses[1]  # the weights moved
    assert read_latest(str(out / "ckpt")) == f"global_step{steps}"
    from infclip.pipeline.model.model import CLIPTowers  # the export (gathered from ZeRO-3 partitions) loads
    model = CLIPTowers.from_pretrained(str(out / "final"))
    assert model.embed_dim == 64 and os.path.isfile(out / "final" / "tokenizer.json")
    assert all(p.numel() > 0 for p in model.parameters())


@pytest.mark.slow
def test_two_process_resume_repeats_the_uninterrupted_curve(zero0_run, tmp_path):
    """Resume the 2-rank run from its mid checkpoint: the same losses as the run that went on."""
    out, sets = zero0_run
    full = tb_scalars(out)
    resumed_out = tmp_path / "resumed"
    sets = [s for s in sets if not s.startswith("train.output_dir=")] + [f"train.output_dir={resumed_out}"]
    deepspeed_launch(sets, cwd=str(tmp_path),
                     extra_args=["--resume", str(out / "ckpt" / f"global_step{STEPS // 2}")])
    resumed = tb_scalars(resumed_out)
    assert sorted(resumed) == list(range(STEPS // 2 + 1, STEPS + 1))
    for step, value in resumed.items():
        assert abs(value - full[step]) <= 1e-6, (step, value, full[step])


# ------------------------------------------------------------------------------- in-process runs

@pytest.fixture(scope="module")
def world_of_one():
    import deepspeed
    import torch.distributed as dist

    if not dist.is_initialized():
        for k, v in (("RANK", "0"), ("WORLD_SIZE", "1"), ("LOCAL_RANK", "0"), ("MASTER_ADDR", "127.0.0.1"),
                     ("MASTER_PORT", str(free_port()))):
            os.environ.setdefault(k, v)
        deepspeed.init_distributed(dist_backend="gloo")
    yield


def run_inproc(shards, out_dir, steps, resume=None, **extra):
    cfg = load_config(TINY, base_overrides(shards, out_dir, steps, **extra))
    return train(cfg, resume=resume)


def test_interrupted_save_leaves_previous_checkpoint_and_resume_is_exact(world_of_one, digits_shards, tmp_path):
    common = {"train.save_every": 2, "model.vision.attention_dropout": 0.1}
    full = run_inproc(digits_shards, tmp_path / "full", 6, **common).losses
    part = tmp_path / "part"
    run_inproc(digits_shards, part, 4, **common)
    ckpt = part / "ckpt"
    assert read_latest(str(ckpt)) == "global_step4"
    # a save of step 6 that died half way: the tag dir exists with a truncated file, latest unmoved
    broken = ckpt / "global_step6"
    broken.mkdir()
    (broken / "mp_rank_00_model_states.pt").write_bytes(b"\x80\x02trunc")
    result = run_inproc(digits_shards, part, 6, resume="latest", **common)
    assert sorted(result.losses) == [5, 6]
    for step in (5, 6):
        assert result.losses[step] == full[step], (step, result.losses[step], full[step])  # bitwise on CPU
    assert read_latest(str(ckpt)) == "global_step6"
    assert list_tags(str(ckpt)) == ["global_step4", "global_step6"]  # keep_last_checkpoints = 2
    torch.load(broken / "rng_rank0.pt", weights_only=True)  # the re-save replaced the broken dir


def test_flat_parameters_train_as_plain_and_resume_exactly(world_of_one, digits_shards, tmp_path):
    """model.flat_parameters under ZeRO-2: the same losses as the unflattened run (the same
    weights, other tensors) and a bitwise resume from its checkpoint."""
    common = {"train.save_every": 2, "zero_optimization.stage": 2}
    plain = run_inproc(digits_shards, tmp_path / "plain", 6, **common).losses
    full = run_inproc(digits_shards, tmp_path / "full", 6, **common, **{"model.flat_parameters": True}).losses
    assert sorted(full) == sorted(plain) == list(range(1, 7))
    for step in full:
        assert full[step] == pytest.approx(plain[step], rel=1e-5), step
    part = tmp_path / "part"
    run_inproc(digits_shards, part, 4, **common, **{"model.flat_parameters": True})
    result = run_inproc(digits_shards, part, 6, resume="latest", **common, **{"model.flat_parameters": True})
    assert sorted(result.losses) == [5, 6]
    for step in (5, 6):
        assert result.losses[step] == full[step], (step, result.losses[step], full[step])  # bitwise on CPU


def test_non_finite_loss_names_the_step(world_of_one, digits_shards, tmp_path):
    # an absurd learning rate overflows the weights once warm-up lets it through
    with pytest.raises(NonFiniteLossError, match=r"non-finite loss .*at step \d+ ") as exc:
        run_inproc(digits_shards, tmp_path / "nan", 8, **{"optimizer.params.lr": 1e30, "gradient_clipping": 0.0})
    bad = int(re.search(r"at step (\d+)", str(exc.value)).group(1))
    logged = tb_scalars(tmp_path / "nan")  # every finite step was logged (log_every 1), the bad one not
    assert bad > 1 and sorted(logged) == list(range(1, bad))


def test_missing_shard_is_a_clear_error(world_of_one, digits_shards, tmp_path):
    missing = os.path.join(digits_shards["dir"], "nope-{000000..000001}.tar")
    with pytest.raises(FileNotFoundError, match="nope-000000.tar"):
        run_inproc(digits_shards, tmp_path / "x", 2, **{"data.train_shards": missing})


def test_missing_optimizer_section_is_a_config_error(world_of_one, digits_shards, tmp_path):
    cfg = load_config(TINY, base_overrides(digits_shards, tmp_path, 2))
    del cfg.ds_config["optimizer"]
    with pytest.raises(ConfigError, match="'optimizer' section is required"):
        train(cfg)


def test_activation_checkpointing_torch_and_deepspeed_follow_plain_training(world_of_one, digits_shards, tmp_path):
    """The towers' checkpointing (torch's, and DeepSpeed's through the activation_checkpointing
    section) recomputes the same math: the same losses as without checkpointing."""
    plain = run_inproc(digits_shards, tmp_path / "plain", 3, **{"train.save_final": False}).losses
    for impl in ("torch", "deepspeed"):
        extra = {"model.gradient_checkpointing": True, "model.checkpointing_impl": impl, "train.save_final": False,
                 "activation_checkpointing": {"partition_activations": False, "contiguous_memory_optimization": False}}
        losses = run_inproc(digits_shards, tmp_path / impl, 3, **extra).losses
        for step, value in plain.items():
            assert abs(losses[step] - value) < 1e-5, (impl, step, losses[step], value)


def test_resume_with_unequal_loader_workers_is_exact_and_old_checkpoints_load(world_of_one, digits_shards, tmp_path):
    """3 loader workers on shards of 64, 64 and 8 samples (micro-batch 8): the third worker runs out
    after one batch. A checkpoint after that keeps each worker's delivered batches (not the
    balanced split of the batch index), and the run resumed from it repeats the uninterrupted
    losses bit for bit. A checkpoint without them (written before they were kept) resumes the
    balanced split, exact where every worker still had data."""
    import json as _json

    from infclip.pipeline.train.checkpoint import MANIFEST, safe_load

    from .test_data import _sized_shards

    shards = _sized_shards(tmp_path / "shards", [64, 64, 8])
    common = {"data.train_shards": shards, "data.workers": 3, "data.shuffle_buffer": 0, "data.shard_shuffle": False,
              "train_micro_batch_size_per_gpu": 8, "train.save_every": 2}
    full = run_inproc(digits_shards, tmp_path / "full", 10, **common).losses
    part = tmp_path / "part"
    run_inproc(digits_shards, part, 6, **common)
    states = part / "ckpt" / "global_step6" / "mp_rank_00_model_states.pt"
    # batches 0..5 came from workers 0, 1, 2, 0, 1, 0 (worker 2 ran out after one): balanced is [2, 2, 2]
    assert safe_load(states)["data_positions"] == [{"worker_batches": [3, 2, 1], "next_worker": 1}]
    result = run_inproc(digits_shards, part, 10, resume="latest", **common)
    assert sorted(result.losses) == [7, 8, 9, 10]
    for step in result.losses:
        assert result.losses[step] == full[step], (step, result.losses[step], full[step])  # bitwise on CPU

    old = tmp_path / "old"
    run_inproc(digits_shards, old, 4, **common)
    tag = old / "ckpt" / "global_step4"
    client = torch.load(tag / "mp_rank_00_model_states.pt", weights_only=False)
    assert client.pop("data_positions") == [{"worker_batches": [2, 1, 1], "next_worker": 1}]
    torch.save(client, tag / "mp_rank_00_model_states.pt")
    manifest = _json.loads((tag / MANIFEST).read_text())
    manifest["files"]["mp_rank_00_model_states.pt"] = (tag / "mp_rank_00_model_states.pt").stat().st_size
    (tag / MANIFEST).write_text(_json.dumps(manifest))
    result = run_inproc(digits_shards, old, 10, resume="latest", **common)
    assert sorted(result.losses) == [5, 6, 7, 8, 9, 10]
    for step in result.losses:
        assert result.losses[step] == full[step], (step, result.losses[step], full[step])


def test_gpu_decode_path_trains_and_logs_its_time(world_of_one, digits_shards, tmp_path):
    """data.decode "gpu" through a run (on the CPU its stage decodes with PIL and crops with the
    kernel under Triton's interpreter): it trains, and the decode time reaches TensorBoard. (Its
    resume is the loader's: tests/pipeline/test_gpu_decode.py.)"""
    common = {"data.decode": "gpu", "train_micro_batch_size_per_gpu": 8}
    full = run_inproc(digits_shards, tmp_path / "full", 2, **common).losses
    assert sorted(full) == [1, 2] and all(math.isfinite(v) for v in full.values())
    assert sorted(tb_scalars(tmp_path / "full", "data/gpu_decode_ms")) == [1, 2]
    assert sorted(tb_scalars(tmp_path / "full", "data/gpu_decode_fraction")) == [1, 2]


def test_the_logger_writes_the_decode_time_and_the_steps_stall_on_it(tmp_path):
    """The GPU decode's time a batch and the time the step's stream stood waiting for a batch reach
    TensorBoard as the window's means and as shares of its wall time; a run without device waits
    writes no stall."""
    from infclip.pipeline.train.metrics import TrainLogger

    log = TrainLogger(str(tmp_path / "tb"), total_steps=2, start_step=0, micro_batch=4, workers=1)
    for decode, stall in ((10.0, 2.0), (14.0, 6.0)):
        log.micro_step(samples=4, data_s=0.0, worker_s=0.1, loss_ms=1.0, decode_ms=decode, stall_ms=stall)
    t0, before = log.window["t"], time.perf_counter()
    log.log_step(1, 1.0, lr=0.1, scale=None, grad_norm=None, skipped_samples=0, skipped_steps=0,
                 device=torch.device("cpu"))
    shortest, longest = 1e3 * (before - t0), 1e3 * (time.perf_counter() - t0)  # the window's wall time
    log.micro_step(samples=4, data_s=0.0, worker_s=0.1, loss_ms=1.0, decode_ms=3.0)
    log.log_step(2, 1.0, lr=0.1, scale=None, grad_norm=None, skipped_samples=0, skipped_steps=0,
                 device=torch.device("cpu"))
    log.close()
    assert tb_scalars(tmp_path, "data/gpu_decode_ms") == {1: 12.0, 2: 3.0}
    assert tb_scalars(tmp_path, "data/gpu_stall_ms") == {1: 4.0}
    fraction = tb_scalars(tmp_path, "data/gpu_stall_fraction")[1]
    assert 8.0 / longest <= fraction <= 8.0 / shortest, (fraction, shortest, longest)


def test_the_logger_says_once_when_the_step_stands_waiting_for_decoded_batches(tmp_path, caplog):
    """A window whose step stood more than a tenth of its time on the GPU waiting for batches gets one
    warning naming the setting to change (not the first window, which holds the loader's start)."""
    import logging

    from infclip.pipeline.train.metrics import TrainLogger

    log = TrainLogger(str(tmp_path / "tb"), total_steps=4, start_step=0, micro_batch=4, workers=1)
    with caplog.at_level(logging.WARNING, logger="infclip.pipeline.train.metrics"):
        for step in range(1, 5):
            t0 = time.perf_counter()
            while time.perf_counter() - t0 < 0.01:  # a 10 ms window; the stall below is 8 ms of it
                pass
            log.micro_step(samples=4, data_s=0.0, worker_s=0.1, loss_ms=1.0, decode_ms=1.0, stall_ms=8.0)
            log.log_step(step, 1.0, lr=0.1, scale=None, grad_norm=None, skipped_samples=0, skipped_steps=0,
                         device=torch.device("cpu"))
    log.close()
    warned = [r.getMessage() for r in caplog.records if "gpu_stall_fraction" in r.getMessage()]
    assert len(warned) == 1 and not warned[0].startswith("step 1:") and "gpu_decode_lanes" in warned[0], warned


def test_deepspeed_scheduler_start_warning_is_not_printed(world_of_one, digits_shards, tmp_path):
    """DeepSpeed's warm-up schedulers warn "before it has started" from their own constructors;
    a run does not print it (the control: the same scheduler built directly does)."""
    import logging

    from deepspeed.runtime.lr_schedules import WarmupCosineLR
    from deepspeed.utils import logger as ds_logger

    seen = []

    class Keep(logging.Handler):
        def emit(self, record):
            seen.append(record.getMessage())

    keep = Keep(level=logging.WARNING)
    ds_logger.addHandler(keep)
    try:
        run_inproc(digits_shards, tmp_path / "run", 1)
        assert not any("before it has started" in m for m in seen), seen
        WarmupCosineLR(torch.optim.SGD([torch.nn.Parameter(torch.zeros(1))], lr=0.1), total_num_steps=10)
        assert any("before it has started" in m for m in seen)
    finally:
        ds_logger.removeHandler(keep)
