"""End-to-end step time of the pipeline on one GPU: towers + loss + DeepSpeed, synthetic batches.

Design: the batches are random tensors already on the GPU, so data loading is not measured;
each step is exactly what ``pipeline.train`` runs (``pipeline.train.forward_backward`` then
``engine.step()``). Two studies, one JSONL row per measurement in bench/results/pipeline.jsonl:

  throughput  ViT-B/32 at micro-batch 256, bf16, gradient checkpointing, ZeRO-2 and ZeRO-3,
              tiled loss (impl triton) vs naive (full B x B matrix), samples/s after warm-up
              (compare: a plain DeepSpeed smoke of the same towers did 1,060 / 539 samples/s
              at ZeRO-2 / ZeRO-3 on an H200, BENCHMARKS.md).
  max_batch   the chunked backbone (GradCache) at per-GPU batches 8192 ... 65536 for ViT-B/32
              and ViT-L/14, chunk 256: one warm-up step at two chunks, then one timed step per
              size; stops at the first OOM and skips sizes whose predicted step time exceeds
              --max_step_s (scaled from the previous size).

Limit: one GPU, world size 1 (no data-parallel loss); the pixel tensor of the batch itself
(B x 3 x 224 x 224 bf16, 19.7 GB at B = 65536) lives on the GPU.

Run: ``deepspeed --num_gpus 1 bench/bench_pipeline.py`` or ``python bench/bench_pipeline.py``
(``--only throughput|max_batch``, ``--max_batch_sizes vitb32:8192,16384 vitl14:8192`` ...).
On the device machine export TORCH_CUDA_ARCH_LIST=9.0 first (DeepSpeed cannot parse 9.0a).
"""

from __future__ import annotations

import argparse
import datetime
import gc
import json
import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import torch  # noqa: E402

PRESETS = {
    "vitb32": {"embed_dim": 512,
               "vision": {"image_size": 224, "patch_size": 32, "hidden_size": 768, "layers": 12, "heads": 12},
               "text": {"context_length": 77, "hidden_size": 512, "layers": 12, "heads": 8, "vocab_size": 49408}},
    "vitb16": {"embed_dim": 512,
               "vision": {"image_size": 224, "patch_size": 16, "hidden_size": 768, "layers": 12, "heads": 12},
               "text": {"context_length": 77, "hidden_size": 512, "layers": 12, "heads": 8, "vocab_size": 49408}},
    "vitl14": {"embed_dim": 768,
               "vision": {"image_size": 224, "patch_size": 14, "hidden_size": 1024, "layers": 24, "heads": 16},
               "text": {"context_length": 77, "hidden_size": 768, "layers": 12, "heads": 12, "vocab_size": 49408}},
}
EOS, PAD, BOS = 1, 0, 2


def synthetic_batch(n: int, cfg, device, dtype):
    g = torch.Generator(device=device).manual_seed(n)
    size, ctx, vocab = cfg.vision.image_size, cfg.text.context_length, cfg.text.vocab_size
    pv = torch.randn(n, 3, size, size, device=device, dtype=dtype, generator=g)
    ids = torch.randint(3, vocab, (n, ctx), device=device, generator=g)
    lengths = torch.randint(8, ctx, (n,), device=device, generator=g)
    pos = torch.arange(ctx, device=device)[None]
    mask = (pos <= lengths[:, None]).long()
    ids = torch.where(pos == lengths[:, None], torch.full_like(ids, EOS), ids)
    ids = torch.where(mask.bool(), ids, torch.full_like(ids, PAD))
    ids[:, 0] = BOS
    return pv, ids, mask


def build(preset: str, zero: int, micro: int, grad_ckpt: bool, impl: str):
    import deepspeed

    from ops import ContrastiveLoss, ContrastiveLossConfig
    from pipeline.model import CLIPTowers, ModelConfig

    cfg = ModelConfig.from_dict({**PRESETS[preset], "gradient_checkpointing": grad_ckpt})
    torch.manual_seed(0)
    model = CLIPTowers(cfg, eos_token_id=EOS, pad_token_id=PAD, bos_token_id=BOS)
    ds = {"train_micro_batch_size_per_gpu": micro, "gradient_accumulation_steps": 1, "steps_per_print": 10**9,
          "gradient_clipping": 1.0, "bf16": {"enabled": True},
          "optimizer": {"type": "AdamW", "params": {"lr": 1e-4, "weight_decay": 0.1, "torch_adam": True}},
          "zero_optimization": {"stage": zero, "overlap_comm": True, "contiguous_gradients": True}}
    engine, *_ = deepspeed.initialize(model=model, model_parameters=model.parameters(), config=ds)
    engine.train()
    crit = ContrastiveLoss(ContrastiveLossConfig(impl=impl))
    return engine, cfg, (lambda img, txt, scale, bias: crit(img, txt, scale))


def release(engine) -> None:
    if hasattr(engine, "destroy"):
        engine.destroy()
    del engine
    gc.collect()
    torch.cuda.empty_cache()


def timed_steps(engine, loss_fn, batch, steps: int, chunk):
    from pipeline.train import forward_backward

    torch.cuda.synchronize()
    loss_ms, t0 = 0.0, time.perf_counter()
    for _ in range(steps):
        loss, ms, _ = forward_backward(engine, *batch, loss_fn, chunk)
        engine.step()
        loss_ms += ms
    torch.cuda.synchronize()
    return (time.perf_counter() - t0) / steps, loss_ms / steps, float(loss)


def base_row(args) -> dict:
    import deepspeed
    import triton

    return {"bench": "pipeline", "gpu": torch.cuda.get_device_name(), "torch": torch.__version__,
            "triton": triton.__version__, "deepspeed": deepspeed.__version__,
            "time": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds")}


def throughput(args, rows):
    for zero in args.zero:
        for impl in args.impls:
            row = {**base_row(args), "study": "throughput", "model": args.throughput_model, "zero": zero,
                   "loss_impl": impl, "micro_batch": args.micro_batch, "chunk": None, "grad_ckpt": True}
            engine = None
            try:
                engine, cfg, loss_fn = build(args.throughput_model, zero, args.micro_batch, True, impl)
                batch = synthetic_batch(args.micro_batch, cfg, engine.device, torch.bfloat16)
                timed_steps(engine, loss_fn, batch, args.warmup, None)
                torch.cuda.reset_peak_memory_stats()
                step_s, loss_ms, loss = timed_steps(engine, loss_fn, batch, args.steps, None)
                row.update(status="ok", step_ms=step_s * 1e3, samples_per_s=args.micro_batch / step_s,
                           loss_op_ms=loss_ms, peak_mem_gb=torch.cuda.max_memory_allocated() / 2**30, loss=loss)
            except torch.OutOfMemoryError:
                row.update(status="oom")
            finally:
                if engine is not None:
                    release(engine)
            report(row, rows, args)


def max_batch(args, rows):
    for spec in args.max_batch_sizes:
        preset, sizes = spec.split(":")
        sizes = [int(s) for s in sizes.split(",")]
        engine = None
        try:
            engine, cfg, loss_fn = build(preset, args.max_batch_zero, args.chunk, args.max_batch_grad_ckpt, "triton")
            warm = synthetic_batch(2 * args.chunk, cfg, engine.device, torch.bfloat16)
            timed_steps(engine, loss_fn, warm, 1, args.chunk)
            del warm
            last = None
            for n in sizes:
                row = {**base_row(args), "study": "max_batch", "model": preset, "zero": args.max_batch_zero,
                       "loss_impl": "triton", "micro_batch": n, "chunk": args.chunk,
                       "grad_ckpt": args.max_batch_grad_ckpt}
                if last is not None and last[1] * n / last[0] > args.max_step_s:
                    row.update(status="skipped", predicted_step_s=last[1] * n / last[0])
                    report(row, rows, args)
                    continue
                try:
                    batch = synthetic_batch(n, cfg, engine.device, torch.bfloat16)
                    torch.cuda.reset_peak_memory_stats()
                    step_s, loss_ms, loss = timed_steps(engine, loss_fn, batch, 1, args.chunk)
                    del batch
                    last = (n, step_s)
                    row.update(status="ok", step_ms=step_s * 1e3, samples_per_s=n / step_s, loss_op_ms=loss_ms,
                               peak_mem_gb=torch.cuda.max_memory_allocated() / 2**30, loss=loss)
                    report(row, rows, args)
                except torch.OutOfMemoryError:
                    row.update(status="oom")
                    report(row, rows, args)
                    break
                finally:
                    gc.collect()
                    torch.cuda.empty_cache()
        finally:
            if engine is not None:
                release(engine)


def report(row, rows, args) -> None:
    rows.append(row)
    os.makedirs(os.path.dirname(args.out), exist_ok=True)
    with open(args.out, "a") as f:
        f.write(json.dumps(row) + "\n")
    print(fmt(row), flush=True)


def fmt(r) -> str:
    num = (lambda k, f: format(r[k], f) if isinstance(r.get(k), (int, float)) else "-")
    return (f"{r['study']:<10} {r['model']:<7} zero{r['zero']} {r['loss_impl']:<7} B={r['micro_batch']:<6} "
            f"chunk={str(r['chunk']):<5} ckpt={int(r['grad_ckpt'])} {r['status']:<7} "
            f"{num('samples_per_s', '9.1f')} samples/s  step {num('step_ms', '10.1f')} ms  "
            f"loss-op {num('loss_op_ms', '8.2f')} ms  peak {num('peak_mem_gb', '6.2f')} GiB")


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--only", choices=["throughput", "max_batch"], default=None)
    p.add_argument("--throughput_model", default="vitb32", choices=sorted(PRESETS))
    p.add_argument("--micro_batch", type=int, default=256)
    p.add_argument("--zero", type=int, nargs="+", default=[2, 3])
    p.add_argument("--impls", nargs="+", default=["triton", "naive"])
    p.add_argument("--warmup", type=int, default=3)
    p.add_argument("--steps", type=int, default=10)
    p.add_argument("--max_batch_sizes", nargs="+",
                   default=["vitb32:8192,16384,32768,65536", "vitl14:8192,16384,32768,65536"],
                   help="PRESET:SIZE,SIZE,... per-GPU batches for the chunked backbone")
    p.add_argument("--chunk", type=int, default=256)
    p.add_argument("--max_batch_zero", type=int, default=2)
    p.add_argument("--max_batch_grad_ckpt", action="store_true", help="also checkpoint inside each chunk")
    p.add_argument("--max_step_s", type=float, default=90.0, help="skip sizes predicted to take longer")
    p.add_argument("--out", default=os.path.join(os.path.dirname(os.path.abspath(__file__)), "results",
                                                 "pipeline.jsonl"))
    p.add_argument("--local_rank", type=int, default=None)
    args = p.parse_args(argv)
    if not torch.cuda.is_available():
        print("bench_pipeline needs a CUDA GPU", file=sys.stderr)
        return 2
    from pipeline.train import single_process_env

    single_process_env()
    import deepspeed

    deepspeed.init_distributed(dist_backend="nccl")
    torch.backends.cuda.matmul.allow_tf32 = True
    rows: list = []
    if args.only in (None, "throughput"):
        throughput(args, rows)
    if args.only in (None, "max_batch"):
        max_batch(args, rows)
    print("\n" + "\n".join(fmt(r) for r in rows))
    return 0


if __name__ == "__main__":
    sys.exit(main())
