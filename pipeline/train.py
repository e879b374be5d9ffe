"""The training loop: DeepSpeed engine, contrastive loss, TensorBoard, checkpoints, resume.

Design: one function, :func:`train`, driven by a :class:`~pipeline.config.RunConfig`. DeepSpeed
owns the optimizer, scheduler, precision, ZeRO stage and gradient clipping (its JSON keys are
handed to ``deepspeed.initialize`` unchanged); the project owns the towers, the data stream,
the loss (``ops.ContrastiveLoss`` over DeepSpeed's data-parallel group) and the run state.
Every micro-batch goes forward, then the loss runs on detached feature leaves and its feature
gradients are back-propagated through the towers with a linear surrogate via
``engine.backward`` (the same path as the chunked backbone with one chunk; see
:mod:`pipeline.chunked`); this times the loss op on its own (``train/loss_op_ms``).

Resume restores the engine state, the step, the epoch and batch position of the data stream and
every rank's RNG, so a resumed run repeats the uninterrupted run's losses (bitwise on CPU).
Limit: the data position is exact only when the stream is deterministic for (epoch, rank,
start_batch), which ``pipeline.data`` guarantees for the same world size and worker count.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import math
import os
import resource
import socket
import time
from typing import TYPE_CHECKING, Any, Callable, Mapping, Optional

import torch
import torch.distributed as dist

from ops import ContrastiveLoss
from ops.config import ConfigError, parse_section, require_at_least

from .checkpoint import load_checkpoint, resolve_resume, save_checkpoint
from .model import CLIPTowers, mark_zero3_leaf_layers
from .step import forward_backward, grad_norm_zero0

if TYPE_CHECKING:
    from .config import RunConfig

__all__ = ["TrainConfig", "TrainResult", "train", "NonFiniteLossError", "single_process_env"]

logger = logging.getLogger(__name__)


class NonFiniteLossError(FloatingPointError):
    """The loss became NaN or infinite; the message names the step."""


@dataclasses.dataclass
class TrainConfig:
    """The ``train`` section: run length, logging, checkpoints, chunking."""

    steps: int = 200
    """Optimizer steps to run (each: gradient_accumulation_steps micro-batches per rank)."""
    epochs: Optional[int] = None
    """Also stop when the data stream has completed this many epochs (None: steps only)."""
    log_every: int = 10
    """Log scalars to TensorBoard and a progress line every this many steps."""
    save_every: int = 0
    """Checkpoint every this many steps (0: only at the end)."""
    save_final: bool = True
    """Checkpoint when the run ends."""
    export_final: bool = True
    """At the end, write output_dir/final: CLIPTowers.save_pretrained + the tokenizer (for eval)."""
    output_dir: str = "runs/default"
    """Run directory: ckpt/ (DeepSpeed checkpoints), tb/ (TensorBoard), tokenizer/, final/."""
    seed: int = 0
    """Seed of the model init (same on all ranks) and of each rank's dropout stream (seed + rank)."""
    chunk_size: Optional[int] = None
    """GradCache-style chunked backbone: rows per tower forward (None: the whole micro-batch)."""
    keep_last_checkpoints: int = 2
    """Keep this many newest checkpoints (0: keep all)."""
    weight_decay_1d: bool = False
    """Apply the optimizer's weight decay to 1-D parameters too (biases, norms, logit scale/bias);
    CLIP's default is not to."""

    def __post_init__(self) -> None:
        require_at_least(self, 1, "steps", "log_every")
        require_at_least(self, 0, "save_every", "keep_last_checkpoints")
        require_at_least(self, 1, "epochs", "chunk_size", optional=True)
        if not self.output_dir:
            raise ConfigError("'output_dir' must not be empty")

    @classmethod
    def from_dict(cls, data: Optional[Mapping[str, Any]], source: Optional[str] = None) -> "TrainConfig":
        return parse_section(cls, data, "train", source)


@dataclasses.dataclass
class TrainResult:
    """What :func:`train` returns (on every rank)."""

    step: int
    losses: dict
    """step -> mean loss of that step (the steps this process ran)."""
    output_dir: str
    final_dir: Optional[str]
    eval_metrics: dict


# ---------------------------------------------------------------------------------------- helpers

def _world() -> tuple[int, int]:
    if dist.is_available() and dist.is_initialized():
        return dist.get_rank(), dist.get_world_size()
    return 0, 1


def _barrier() -> None:
    if dist.is_available() and dist.is_initialized():
        dist.barrier()


def _peak_mem_gb(device: torch.device) -> float:
    if device.type == "cuda":
        return torch.cuda.max_memory_allocated(device) / 2**30
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20  # KiB on Linux


def _param_groups(model: torch.nn.Module, decay_1d: bool) -> list[dict]:
    decay, no_decay = [], []
    for p in model.parameters():
        if p.requires_grad:
            shape = getattr(p, "ds_shape", p.shape)  # a zero.Init parameter's own data is its shard
            (decay if len(shape) >= 2 or decay_1d else no_decay).append(p)
    groups = [{"params": decay}]
    if no_decay:
        groups.append({"params": no_decay, "weight_decay": 0.0})
    return groups


def _tb_dir(ds_config: dict, output_dir: str) -> str:
    tb = ds_config.get("tensorboard") or {}
    if tb.get("enabled") and tb.get("output_path"):
        return os.path.join(tb["output_path"], tb.get("job_name", "DeepSpeedJobName"))
    return os.path.join(output_dir, "tb")


def _gathered(engine: Any):
    """Context gathering ZeRO-3 partitioned parameters (all ranks must enter), else a no-op."""
    import contextlib

    if engine.zero_optimization_stage() == 3:
        import deepspeed
        return deepspeed.zero.GatheredParameters(list(engine.module.parameters()), modifier_rank=None)
    return contextlib.nullcontext()


def _fmt_time(seconds: float) -> str:
    seconds = int(max(seconds, 0))
    return f"{seconds // 3600}:{seconds % 3600 // 60:02d}:{seconds % 60:02d}"


class _Batches:
    """The data stream across epochs, with its (epoch, batch_in_epoch) position.

    All ranks switch epochs together: if any rank's stream ends, every rank starts the next epoch
    (a rank's unconsumed batch is dropped), so collectives never wait on a rank without data.
    Loading runs under ``torch.random.fork_rng``: creating a DataLoader iterator draws from the
    global torch RNG, and a resumed run creates one at a point where the uninterrupted run did
    not, so the data stream must not touch the RNG that drives dropout (it seeds its own).
    """

    def __init__(self, build: Callable[[int, int], Any], epoch: int, batch_in_epoch: int,
                 max_epochs: Optional[int], device: torch.device) -> None:
        self.build, self.epoch, self.batch_in_epoch = build, epoch, batch_in_epoch
        self.max_epochs, self.device = max_epochs, device
        self.skipped = 0
        with torch.random.fork_rng(devices=[]):
            self._it = iter(self.build(self.epoch, self.batch_in_epoch))

    def _all_have(self, have: bool) -> bool:
        if not (dist.is_available() and dist.is_initialized()) or dist.get_world_size() == 1:
            return have
        flag = torch.tensor([1 if have else 0], dtype=torch.int32,
                            device=self.device if dist.get_backend() == "nccl" else "cpu")
        dist.all_reduce(flag, op=dist.ReduceOp.MIN)
        return bool(flag.item())

    def next(self) -> Optional[dict]:
        with torch.random.fork_rng(devices=[]):
            return self._next()

    def _next(self) -> Optional[dict]:
        fresh = False
        while True:
            batch = next(self._it, None)
            if self._all_have(batch is not None):
                self.batch_in_epoch += 1
                self.skipped += int(batch.get("num_skipped", 0))
                return batch
            if fresh:
                raise RuntimeError(f"the training stream yielded no batch in epoch {self.epoch} on some rank; "
                                   "too few samples for the micro-batch and world size?")
            self.epoch += 1
            self.batch_in_epoch = 0
            if self.max_epochs is not None and self.epoch >= self.max_epochs:
                return None
            self._it = iter(self.build(self.epoch, 0))
            fresh = True


# ------------------------------------------------------------------------------------------ train

def train(run_cfg: "RunConfig", *, resume: Optional[str] = None,
          evaluator: Optional[Callable[[CLIPTowers, int], Mapping[str, float]]] = None) -> TrainResult:
    """Train the CLIP towers as ``run_cfg`` says.

    Args:
        run_cfg: from :func:`pipeline.config.load_config`.
        resume: None (fresh run), ``"latest"`` (the run's newest checkpoint, or fresh if none),
            or a checkpoint path (see :func:`pipeline.checkpoint.resolve_resume`).
        evaluator: ``callable(model, step) -> {name: value}`` called on EVERY rank (a ZeRO-3
            forward needs all of them) with the unwrapped model in eval mode under no_grad,
            every ``evaluator.every`` steps (else ``eval.every`` of the config; 0: never) and
            after the last step when ``evaluator.at_end`` (else ``eval.at_end``, default true);
            rank 0's values are logged as ``eval/<name>``.
    Returns:
        :class:`TrainResult`.
    Raises:
        NonFiniteLossError: the loss is NaN/inf (the message names the step).
    """
    import deepspeed

    from .data import build_train_loader, prepare_shards
    from .tokenizer import ensure_tokenizer

    tcfg = run_cfg.train
    ds_config = dict(run_cfg.ds_config)
    if "optimizer" not in ds_config:
        raise ConfigError(f"{run_cfg.source}: an 'optimizer' section is required (DeepSpeed builds the optimizer)")
    deepspeed.init_distributed(dist_backend=None, auto_mpi_discovery=True)
    rank, world = _world()
    out_dir = tcfg.output_dir
    ckpt_dir = os.path.join(out_dir, "ckpt")
    model_cfg = run_cfg.model
    image_size, context_length = model_cfg.vision.image_size, model_cfg.text.context_length

    # data and tokenizer: rank 0 first (it may generate the digits shards and train the BPE)
    tok_dir = os.path.join(out_dir, "tokenizer")
    tokenizer = shards = None
    for turn in (0, 1):
        if (rank == 0) == (turn == 0):
            if rank == 0:
                os.makedirs(out_dir, exist_ok=True)
            shards = prepare_shards(run_cfg.data, "train")
            tokenizer = ensure_tokenizer(run_cfg.data, shards, tok_dir, context_length=context_length)
        _barrier()

    torch.manual_seed(tcfg.seed)  # identical init on every rank
    zero3 = run_cfg.zero_stage == 3
    model = CLIPTowers.from_config(model_cfg, tokenizer,
                                   zero3_config=ds_config if zero3 and model_cfg.zero3_init else None)
    if model_cfg.pretrained:
        image_size, context_length = model.image_size, model.context_length
    if zero3 and model_cfg.zero3_leaf_layers:
        mark_zero3_leaf_layers(model)
    engine, _, _, _ = deepspeed.initialize(model=model, model_parameters=_param_groups(model, tcfg.weight_decay_1d),
                                           config=ds_config)
    device = engine.device
    if model_cfg.gradient_checkpointing and model_cfg.checkpointing_impl == "deepspeed":
        deepspeed.checkpointing.configure(None, deepspeed_config=ds_config)
        engine.module.set_gradient_checkpointing(True, deepspeed.checkpointing.checkpoint)
    dp_group = engine.data_parallel_group if hasattr(engine, "data_parallel_group") else None
    dp_rank = dist.get_rank(dp_group) if world > 1 else 0
    dp_world = dist.get_world_size(dp_group) if world > 1 else 1
    criterion = ContrastiveLoss(run_cfg.contrastive_loss)
    siglip = run_cfg.contrastive_loss.loss == "siglip"

    def loss_fn(img, txt, scale, bias):
        return criterion(img, txt, scale, bias if siglip else None, process_group=dp_group)

    micro = run_cfg.micro_batch_size
    gas = engine.gradient_accumulation_steps()
    in_dtype = run_cfg.param_dtype

    # state: fresh or resumed
    step, epoch, batch_in_epoch, skipped0 = 0, 0, 0, 0
    target = resolve_resume(resume, ckpt_dir)
    if target is not None:
        client = load_checkpoint(engine, *target)
        step, epoch = int(client["step"]), int(client["epoch"])
        batch_in_epoch, skipped0 = int(client["batch_in_epoch"]), int(client.get("skipped_samples", 0))
        logger.info("resumed from %s/%s at step %d (epoch %d, batch %d)", *target, step, epoch, batch_in_epoch)
    else:
        torch.manual_seed(tcfg.seed + 1000 + rank)  # per-rank dropout stream

    def build(ep: int, start: int):
        return build_train_loader(run_cfg.data, tokenizer, image_size=image_size, context_length=context_length,
                                  batch_size=micro, rank=dp_rank, world_size=dp_world, epoch=ep,
                                  seed=run_cfg.data.seed, start_batch=start, shards=shards)

    batches = _Batches(build, epoch, batch_in_epoch, tcfg.epochs, device)
    batches.skipped = skipped0

    writer = None
    if rank == 0:
        from torch.utils.tensorboard import SummaryWriter
        writer = SummaryWriter(_tb_dir(ds_config, out_dir))
        with open(os.path.join(out_dir, "config.json"), "w") as f:
            json.dump(run_cfg.raw, f, indent=2)

    eval_section = run_cfg.eval or {}
    eval_every = eval_at_end = None
    if evaluator is not None:
        eval_every = getattr(evaluator, "every", None)
        eval_every = eval_section.get("every", 0) if eval_every is None else eval_every
        eval_at_end = getattr(evaluator, "at_end", None)
        eval_at_end = eval_section.get("at_end", True) if eval_at_end is None else eval_at_end
    eval_metrics: dict = {}

    def run_eval(at_step: int) -> None:
        # every rank calls the evaluator (a ZeRO-3 forward needs all ranks); rank 0 logs
        nonlocal eval_metrics
        module = engine.module
        was_training = module.training
        module.eval()
        with torch.no_grad():
            eval_metrics = {k: float(v) for k, v in dict(evaluator(module, at_step) or {}).items()}
        module.train(was_training)
        if writer is not None:
            for k, v in eval_metrics.items():
                writer.add_scalar(f"eval/{k}", v, at_step)
            logger.info("eval at step %d: %s", at_step, ", ".join(f"{k} {v:.4f}" for k, v in eval_metrics.items()))
        _barrier()

    def client_state() -> dict:
        return {"step": step, "epoch": batches.epoch, "batch_in_epoch": batches.batch_in_epoch,
                "skipped_samples": batches.skipped, "world_size": world,
                "data_seed": run_cfg.data.seed, "micro_batch": micro}

    losses: dict = {}
    engine.train()
    t_start = time.perf_counter()
    start_step = step
    window = _new_window(first=True)
    done = False
    grad_norm = None
    while step < tcfg.steps and not done:
        step_loss = 0.0
        for micro_i in range(gas):
            t_data = time.perf_counter()
            batch = batches.next()
            window["data_s"] += time.perf_counter() - t_data
            if batch is None:
                done = True
                break
            window["worker_s"] += float(batch.get("worker_s", 0.0))
            pv = batch["pixel_values"].to(device, dtype=in_dtype, non_blocking=True)
            ids = batch["input_ids"].to(device, non_blocking=True)
            mask = batch["attention_mask"].to(device, non_blocking=True)
            chunk = tcfg.chunk_size
            where = f"at step {step + 1} (micro-batch {micro_i}, epoch {batches.epoch})"
            advice = "lower the learning rate, check the data, or use bf16 instead of fp16"
            try:
                loss, loss_ms, scale_value = forward_backward(engine, pv, ids, mask, loss_fn, chunk)
            except FloatingPointError as exc:  # the loss op rejects NaN/Inf features
                raise NonFiniteLossError(f"non-finite loss {where}: {exc}; {advice}") from exc
            value = float(loss)
            if not math.isfinite(value):
                raise NonFiniteLossError(f"non-finite loss ({value}) {where}; {advice}")
            if micro_i == gas - 1 and (step + 1) % tcfg.log_every == 0:
                grad_norm = grad_norm_zero0(engine)
            engine.step()
            step_loss += value / gas
            window["samples"] += pv.shape[0] * dp_world
            window["loss_ms"].append(loss_ms)
            window["n"] += 1
        if done and window["n"] == 0:
            break
        step += 1
        losses[step] = step_loss
        if step % tcfg.log_every == 0 or step == tcfg.steps:
            _log_step(engine, writer, step, step_loss, window, batches, device, micro, t_start, start_step,
                      tcfg.steps, scale_value, grad_norm, workers=run_cfg.data.workers)
            window = _new_window()
        if evaluator is not None and eval_every and step % eval_every == 0:
            run_eval(step)
        if tcfg.save_every and step % tcfg.save_every == 0 and step < tcfg.steps:
            save_checkpoint(engine, ckpt_dir, step, client_state(), tcfg.keep_last_checkpoints)

    if tcfg.save_final and step > start_step:
        save_checkpoint(engine, ckpt_dir, step, client_state(), tcfg.keep_last_checkpoints)
    if evaluator is not None and eval_at_end and not (eval_every and step % eval_every == 0):
        run_eval(step)
    final_dir = None
    if tcfg.export_final:
        final_dir = os.path.join(out_dir, "final")
        with _gathered(engine):
            if rank == 0:
                engine.module.save_pretrained(final_dir)
                tokenizer.save_pretrained(os.path.join(final_dir, "tokenizer"))
        _barrier()
    if writer is not None:
        writer.flush()
        writer.close()
    logger.info("done: %d steps in %s", step - start_step, _fmt_time(time.perf_counter() - t_start))
    return TrainResult(step=step, losses=losses, output_dir=out_dir, final_dir=final_dir, eval_metrics=eval_metrics)


def _new_window(first: bool = False) -> dict:
    """What the loop accumulates between two log lines (``first``: the window with start-up)."""
    return {"t": time.perf_counter(), "samples": 0, "data_s": 0.0, "worker_s": 0.0, "loss_ms": [], "n": 0,
            "first": first}


def _log_step(engine, writer, step, loss, window, batches, device, micro, t_start, start_step, total,
              scale_value, own_grad_norm, workers: int = 0) -> None:
    elapsed = time.perf_counter() - window["t"]
    samples_per_s = window["samples"] / max(elapsed, 1e-9)
    # the loader: each worker's own rate (images over its time making them), all workers together,
    # and the share of the step the loop waited for a batch (> 0.1: the GPU is starved)
    per_worker = window["n"] * micro / window["worker_s"] if window["worker_s"] > 0 else float("nan")
    images_per_s = per_worker * max(workers, 1)
    wait_fraction = window["data_s"] / max(elapsed, 1e-9)
    lr = engine.get_lr()[0] if engine.get_lr() else float("nan")
    grad_norm = engine.get_global_grad_norm()
    grad_norm = own_grad_norm if grad_norm is None else grad_norm
    peak = _peak_mem_gb(device)
    loss_ms = sum(float(t) for t in window["loss_ms"]) / max(len(window["loss_ms"]), 1)
    scale_value = float(scale_value) if scale_value is not None else None
    if writer is not None:
        writer.add_scalar("train/loss", loss, step)
        writer.add_scalar("train/lr", lr, step)
        if scale_value is not None:
            writer.add_scalar("train/logit_scale", scale_value, step)
        if grad_norm is not None:
            writer.add_scalar("train/grad_norm", float(grad_norm), step)
        writer.add_scalar("train/samples_per_s", samples_per_s, step)
        writer.add_scalar("train/loss_op_ms", loss_ms, step)
        writer.add_scalar("train/peak_mem_gb", peak, step)
        writer.add_scalar("data/skipped_samples", batches.skipped, step)
        writer.add_scalar("data/images_per_s", images_per_s, step)
        writer.add_scalar("data/images_per_s_per_worker", per_worker, step)
        writer.add_scalar("data/wait_fraction", wait_fraction, step)
        writer.flush()
        done = step - start_step
        rate = (time.perf_counter() - t_start) / max(done, 1)
        logger.info("step %d/%d loss %.4f lr %.3g scale %s gnorm %s %.1f samples/s loss-op %.1f ms "
                    "mem %.2f GB eta %s", step, total, loss, lr,
                    f"{scale_value:.2f}" if scale_value is not None else "-",
                    f"{float(grad_norm):.3f}" if grad_norm is not None else "-", samples_per_s, loss_ms, peak,
                    _fmt_time(rate * (total - step)))
        if wait_fraction > 0.1 and not window["first"]:
            logger.warning("step %d: %.0f%% of the time went waiting for data (loader: %.0f images/s "
                           "per worker, %d workers); raise data.workers", step, 100 * wait_fraction,
                           per_worker, max(workers, 1))


_MPI_ENV = ("OMPI_COMM_WORLD_SIZE", "PMI_SIZE", "PMIX_RANK", "MV2_COMM_WORLD_SIZE")


def single_process_env() -> None:
    """Without a launcher (and not under mpirun), make this process a world of one: RANK,
    WORLD_SIZE, LOCAL_RANK, LOCAL_WORLD_SIZE and a free MASTER_PORT on 127.0.0.1 (otherwise
    DeepSpeed goes looking for MPI). Keys already set are kept."""
    if "RANK" in os.environ or any(k in os.environ for k in _MPI_ENV):
        return
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    for key, value in (("RANK", "0"), ("WORLD_SIZE", "1"), ("LOCAL_RANK", "0"), ("LOCAL_WORLD_SIZE", "1"),
                       ("MASTER_ADDR", "127.0.0.1"), ("MASTER_PORT", str(port))):
        os.environ.setdefault(key, value)
