"""End-to-end step time of the pipeline on one GPU: towers + loss + DeepSpeed, synthetic batches.

Design: the batches are random tensors already on the GPU, so data loading is not measured;
each step is exactly what ``pipeline.train.train`` runs (``pipeline.train.step.forward_backward`` then
``engine.step()``). Two studies, one JSONL row per measurement in bench/results/pipeline.jsonl:

  throughput  ViT-B/32 (or --throughput_model) at micro-batch 256, bf16, ZeRO-2 and ZeRO-3, the
              pipeline with the presets' settings by default (ds_configs/vitb32.json: flat per-block
              parameters, compiled blocks replayed as CUDA graphs, overlap_comm off, SDPA,
              checkpointing "auto") and the variants asked for (--grad_ckpt, --compile,
              --compile_mode, --flat_parameters, --overlap_comm), tiled loss (impl triton) or naive;
              against anchors in the same process: "torch_eager" and "torch_compile" (the plain
              PyTorch loop a user writes: transformers' CLIPModel with its own loss, autocast
              bf16, fused AdamW, no DeepSpeed, no checkpointing; compiled with torch.compile) and
              "hf_plain" (that CLIPModel under the pipeline's DeepSpeed config). Every row has
              samples/s and MFU = 3 x forward FLOPs per sample (pipeline.model.config.forward_flops,
              docs/mfu.md) x samples/s / the bf16 matmul rate measured in the same run.
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

from infclip.ops.config import DEFAULT_GRAPH_MAX_BATCH  # noqa: E402

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
    # OpenCLIP's ViT-H-14 and ViT-bigG-14 (ds_configs/vith14.json, vitbigg14.json): heads of 80 and 104
    "vith14": {"embed_dim": 1024,
               "vision": {"image_size": 224, "patch_size": 14, "hidden_size": 1280, "layers": 32, "heads": 16},
               "text": {"context_length": 77, "hidden_size": 1024, "layers": 24, "heads": 16, "vocab_size": 49408}},
    "vitbigg14": {"embed_dim": 1280,
                  "vision": {"image_size": 224, "patch_size": 14, "hidden_size": 1664, "layers": 48, "heads": 16,
                             "intermediate_size": 8192},
                  "text": {"context_length": 77, "hidden_size": 1280, "layers": 32, "heads": 20, "vocab_size": 49408}},
}
EOS, PAD, BOS = 1, 0, 2
PLAIN = "hf_plain"
LOOPS = ("torch_eager", "torch_compile")


ZERO3_STEP_WAITS = {1: (), 2: ("fetch", "norm"), 3: ("fetch",)}
"""ZeRO-3 rows' --on_device_step value -> DeepSpeed's host waits kept in the lightened step."""


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


def model_config(preset: str, grad_ckpt="auto", compile="auto", compile_mode="default", flat=False,
                 patch_embedding: str = "gemm", patch_dropout: float = 0.0):
    from infclip.pipeline.model.config import ModelConfig

    return ModelConfig.from_dict({**PRESETS[preset], "gradient_checkpointing": grad_ckpt, "compile": compile,
                                  "compile_mode": compile_mode, "flat_parameters": flat,
                                  "patch_embedding": patch_embedding, "patch_dropout": patch_dropout})


def build(preset: str, zero: int, micro: int, grad_ckpt, impl: str, zero_extra=None, leaf=False,
          compile="auto", bf16_overflow_check: bool = False, distributed: str = "gather",
          compile_mode: str = "default", overlap_comm: bool = True, flat=False, on_device_step: bool = True,
          deepspeed_timers: bool = False, deepcompile: str = "", patch_embedding: str = "gemm",
          loss_graph_max_batch: int = DEFAULT_GRAPH_MAX_BATCH, patch_dropout: float = 0.0):
    import deepspeed

    from infclip.ops import ContrastiveLoss, ContrastiveLossConfig
    from infclip.pipeline.engine.engine import with_engine_defaults
    from infclip.pipeline.model.model import CLIPTowers
    from infclip.pipeline.model.param_layout import mark_zero3_leaf_layers, misaligned_parameters, param_groups

    deepcompile = deepcompile if zero == 3 and impl != PLAIN else ""
    cfg = model_config(preset, grad_ckpt, False if deepcompile else compile, compile_mode, flat if impl != PLAIN else False,
                       patch_embedding, patch_dropout if impl != PLAIN else 0.0)
    torch.manual_seed(0)
    if impl == PLAIN:
        model = plain_hf_clip(cfg, grad_ckpt)
    else:
        model = CLIPTowers(cfg, eos_token_id=EOS, pad_token_id=PAD, bos_token_id=BOS)
    ds = {"train_micro_batch_size_per_gpu": micro, "gradient_accumulation_steps": 1, "steps_per_print": 10**9,
          "gradient_clipping": 1.0, "bf16": {"enabled": True, "check_grad_overflow": bf16_overflow_check},
          "optimizer": {"type": "AdamW", "params": {"lr": 1e-4, "weight_decay": 0.1}},
          "zero_optimization": {"stage": zero, "overlap_comm": overlap_comm, "contiguous_gradients": True,
                                **((zero_extra or {}) if zero == 3 else {})}}
    if zero == 3 and leaf:
        mark_zero3_leaf_layers(model, leaf)
    if deepcompile:  # the whole towers compiled by DeepSpeed, its ZeRO-3 gathers inside the graph
        ds["compile"] = {"deepcompile": True}
    if deepspeed_timers:  # DeepSpeed's default (kept by with_engine_defaults when set)
        ds["timers"] = {"throughput": {"enabled": True, "synchronized": True}}
    ds = with_engine_defaults(ds, impl != PLAIN and cfg.compile is not False)
    engine, *_ = deepspeed.initialize(model=model, model_parameters=param_groups(model), config=ds)
    engine.train()
    if deepcompile:
        torch._dynamo.config.recompile_limit = max(torch._dynamo.config.recompile_limit, 64)  # a graph per block
        from deepspeed.compile.passes import zero3_compile

        # "basic": only the gathers and releases in the graph, not the profiled prefetch passes at step 5
        engine.compile(schedule=[(0, [zero3_compile.add_z3_gather_release])] if deepcompile == "basic" else None)
    from infclip.pipeline.engine.zero3_step import lighten_zero3, restore_deepspeed_zero3
    from infclip.pipeline.engine.zero_step import keep_step_on_device, restore_deepspeed_mask

    if on_device_step and zero == 3:
        keep = ZERO3_STEP_WAITS[int(on_device_step)]
        if keep:  # DeepSpeed's own host waits, kept in the lightened step (an earlier row may have replaced them)
            restore_deepspeed_zero3()
        print(f"# ZeRO-3 step lightened: {lighten_zero3(engine, keep_waits=keep)}"
              f"{', DeepSpeed host waits kept: ' + ' '.join(keep) if keep else ''}", flush=True)
    elif on_device_step:
        print(f"# ZeRO step kept on the device: {keep_step_on_device(engine)}", flush=True)
    else:  # DeepSpeed's own functions back, in case an earlier row of this process replaced them
        restore_deepspeed_mask()
        restore_deepspeed_zero3()
    if zero == 3 and impl != PLAIN:
        from infclip.pipeline.engine.tower_unit import reduce_when_accumulated

        engine.module.bind_flat_views_in_forward()
        reduce_when_accumulated(engine)  # (tower units only)
    bad = misaligned_parameters(engine.module)
    if bad:
        print(f"# {len(bad)} parameters not 16-byte aligned, e.g. {bad[:3]}", flush=True)
    if impl == PLAIN:
        return engine, cfg, None
    world = torch.distributed.get_world_size()
    crit = ContrastiveLoss(ContrastiveLossConfig(impl=impl, distributed=distributed if world > 1 else "none",
                                                 graph_max_batch=loss_graph_max_batch))
    group = engine.data_parallel_group if world > 1 else None
    return engine, cfg, (lambda img, txt, scale, bias: crit(img, txt, scale, process_group=group))


def plain_hf_clip(cfg, grad_ckpt: bool):
    """The anchor: transformers' own CLIPModel (its bf16 full-matrix loss, ``return_loss=True``)
    with the same tower sizes, trained by the same DeepSpeed config: what a plain DeepSpeed
    script gets, measured in the same run as the pipeline."""
    from transformers import CLIPConfig, CLIPModel

    from infclip.pipeline.model.model import _hf_configs, _set_checkpointing

    vision, text = _hf_configs(cfg, cfg.text.vocab_size, {"eos_token_id": EOS, "pad_token_id": PAD,
                                                          "bos_token_id": BOS})
    clip_cfg = CLIPConfig(text_config=text.to_dict(), vision_config=vision.to_dict(), projection_dim=cfg.embed_dim)
    clip_cfg._attn_implementation = "sdpa"
    model = CLIPModel(clip_cfg)
    # DeepSpeed broadcasts parameters as byte views, which a 0-dim tensor cannot take
    model.logit_scale = torch.nn.Parameter(model.logit_scale.detach().reshape(1))
    _set_checkpointing(model, grad_ckpt is True)
    return model


def plain_loop(preset: str, micro: int, compiled: bool, warmup: int, steps: int):
    """The anchor a user writes first: transformers' CLIPModel (its own loss, ``return_loss``),
    fp32 weights, autocast bf16, fused AdamW, no DeepSpeed, no checkpointing; ``compiled``:
    the model under ``torch.compile``. Returns (s/step, peak GiB above the floor, loss)."""
    cfg = model_config(preset, False, False)
    torch.manual_seed(0)
    model = plain_hf_clip(cfg, False).cuda().train()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4, weight_decay=0.1, fused=True)
    fwd = torch.compile(model) if compiled else model
    pv, ids, mask = synthetic_batch(micro, cfg, "cuda", torch.float32)

    def step():
        with torch.autocast("cuda", dtype=torch.bfloat16):
            loss = fwd(input_ids=ids, pixel_values=pv, attention_mask=mask, return_loss=True).loss
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        return loss

    for _ in range(warmup):
        step()
    torch.cuda.synchronize()
    torch.cuda.reset_peak_memory_stats()
    t0 = time.perf_counter()
    for _ in range(steps):
        loss = step()
    torch.cuda.synchronize()
    out = (time.perf_counter() - t0) / steps, torch.cuda.max_memory_allocated() / 2**30, float(loss)
    del model, opt, fwd
    return out


def matmul_tflops() -> float:
    """The dense bf16 matmul rate of this GPU, now (8192^3, median of 10 after warm-up)."""
    a = torch.randn(8192, 8192, device="cuda", dtype=torch.bfloat16)
    b = torch.randn(8192, 8192, device="cuda", dtype=torch.bfloat16)
    for _ in range(3):
        a @ b
    times = []
    for _ in range(10):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        a @ b
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end) / 1e3)
    return 2 * 8192**3 / sorted(times)[len(times) // 2] / 1e12


def mfu(row: dict, args) -> None:
    """Add model FLOPs per sample and MFU to a row with samples_per_s."""
    from infclip.pipeline.model.config import forward_flops

    flops = 3 * forward_flops(model_config(row["model"], patch_dropout=row.get("patch_dropout") or 0.0))
    row["model_gflop_per_sample"] = flops / 1e9
    row["matmul_tflops"] = args.tflops
    if isinstance(row.get("samples_per_s"), float):
        row["mfu"] = flops * row["samples_per_s"] / (args.tflops * 1e12)


def release(engine) -> None:
    if hasattr(engine, "destroy"):
        engine.destroy()
    del engine
    gc.collect()
    torch.cuda.empty_cache()


def timed_steps(engine, loss_fn, batch, steps: int, chunk):
    """``steps`` training steps as pipeline.train.train runs them (the loss checked by a LossGuard)."""
    from infclip.pipeline.train.step import LossGuard, forward_backward

    torch.cuda.synchronize()
    guard = LossGuard(engine.device)
    loss_ms, t0 = [], time.perf_counter()
    for i in range(steps):
        if loss_fn is None:  # the plain HF anchor: loss inside the model's forward
            pv, ids, mask = batch
            loss, ms = engine(input_ids=ids, pixel_values=pv, attention_mask=mask, return_loss=True).loss, float("nan")
            engine.backward(loss)
        else:
            loss, ms, _ = forward_backward(engine, *batch, loss_fn, chunk)
        guard.push(loss, i, 1.0, f"at bench step {i}")
        engine.step()
        loss_ms.append(ms)
    guard.flush()
    torch.cuda.synchronize()
    return (time.perf_counter() - t0) / steps, sum(float(t) for t in loss_ms) / steps, guard.losses[steps - 1]


def host_phases(engine, loss_fn, batch, steps: int) -> dict:
    """Host milliseconds per step spent inside the engine's forward, backward and step over
    ``steps`` steps (perf_counter around each call, no synchronisation added: where the step is
    bound by the host these add up to the step; where it is bound by the GPU, the phase that waits
    on the GPU absorbs the wait), and the step's wall time."""
    spent = {"forward": 0.0, "backward": 0.0, "step": 0.0}

    def timed(name, fn):
        def call(*a, **k):
            t = time.perf_counter()
            try:
                return fn(*a, **k)
            finally:
                spent[name] += time.perf_counter() - t
        return call

    originals = {name: getattr(engine, name) for name in spent}
    for name, fn in originals.items():
        setattr(engine, name, timed(name, fn))  # instance attributes: engine(...) calls forward
    try:
        wall = timed_steps(engine, loss_fn, batch, steps, None)[0]
    finally:
        for name in originals:
            delattr(engine, name)
    return {f"host_{k}_ms": v / steps * 1e3 for k, v in spent.items()} | {"host_wall_ms": wall * 1e3}


def base_row(args) -> dict:
    import deepspeed
    import triton

    world = torch.distributed.get_world_size()
    return {"bench": "pipeline", "gpu": torch.cuda.get_device_name(), "torch": torch.__version__, "world_size": world,
            "distributed": args.distributed if world > 1 else "none",
            "triton": triton.__version__, "deepspeed": deepspeed.__version__,
            "time": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds")}


def throughput(args, rows):
    base = {"study": "throughput", "model": args.throughput_model, "micro_batch": args.micro_batch, "chunk": None}
    for loop in [a for a in args.anchors if a in LOOPS]:
        row = {**base_row(args), **base, "zero": None, "loss_impl": loop, "grad_ckpt": False,
               "compile": loop == "torch_compile"}
        gc.collect()
        torch.cuda.empty_cache()
        floor = torch.cuda.memory_allocated()
        try:
            step_s, peak, loss = plain_loop(args.throughput_model, args.micro_batch, loop == "torch_compile",
                                            args.warmup, args.steps)
            row.update(status="ok", step_ms=step_s * 1e3, samples_per_s=args.micro_batch / step_s,
                       peak_mem_gb=peak - floor / 2**30, loss=loss)
        except torch.OutOfMemoryError:
            row.update(status="oom")
        mfu(row, args)
        report(row, rows, args)
    if args.loss_graph_always:  # every call as if its forward had replayed: the idle test skipped
        from infclip.ops import registered

        graphed = registered._graphed
        registered._graphed = lambda x, options, forward_replayed=False: graphed(x, options, True)
    impls = list(args.impls) + ([PLAIN] if PLAIN in args.anchors else [])
    runs = [(zero, leaf, impl, ckpt, comp, flat, on_device, patch, graphs, extra, pdrop) for zero in args.zero
            for leaf in (args.zero3_leaf if zero == 3 else [0])
            for extra in (args.zero3_extra if zero == 3 else ["{}"]) for impl in impls
            for ckpt in args.grad_ckpt for comp in args.compile
            for flat in (args.flat_parameters if impl != PLAIN else [0])
            for on_device in (args.on_device_step if zero == 3 else
                              sorted({min(v, 1) for v in args.on_device_step}) if zero in (0, 1, 2) else [1])
            for patch in (args.patch_embedding if impl != PLAIN else ["conv"])
            for graphs in (args.loss_graph_max_batch if impl != PLAIN else [0])
            for pdrop in (args.patch_dropout if impl != PLAIN else [0.0])]
    for zero, leaf, impl, ckpt, comp, flat, on_device, patch, graphs, extra, pdrop in runs:
        ckpt_v, comp_v = _flag(ckpt), _flag(comp)
        row = {**base_row(args), **base, "zero": zero, "loss_impl": impl, "grad_ckpt": ckpt_v, "compile": comp_v,
               "bf16_check_grad_overflow": args.bf16_overflow_check, "compile_mode": args.compile_mode,
               "overlap_comm": bool(args.overlap_comm), "flat_parameters": flat,
               "on_device_step": bool(on_device), "deepspeed_timers": bool(args.deepspeed_timers),
               "patch_embedding": patch, "loss_graph_max_batch": graphs, "patch_dropout": pdrop}
        if zero == 3:
            row["zero3_leaf_layers"] = leaf
            if on_device in (2, 3):
                row["zero3_host_waits_kept"] = {2: "fetch norm", 3: "fetch"}[on_device]
        if zero == 3 and args.deepcompile:
            row["deepcompile"] = args.deepcompile
        if zero == 3 and extra != "{}":
            row["zero3_extra"] = json.loads(extra)
        engine = None
        gc.collect()
        torch.cuda.empty_cache()
        # a destroyed ZeRO-3 engine leaves ~2 GiB allocated in this process (DeepSpeed keeps
        # references): peaks are counted from what is allocated before the engine is built
        floor = torch.cuda.memory_allocated()
        row["leftover_gb"] = floor / 2**30
        try:
            engine, cfg, loss_fn = build(args.throughput_model, zero, args.micro_batch, ckpt_v, impl,
                                         json.loads(extra), leaf, comp_v, args.bf16_overflow_check,
                                         args.distributed, args.compile_mode, bool(args.overlap_comm), flat,
                                         int(on_device), bool(args.deepspeed_timers), args.deepcompile,
                                         patch, graphs, pdrop)
            batch = synthetic_batch(args.micro_batch, cfg, engine.device, torch.bfloat16)
            timed_steps(engine, loss_fn, batch, args.warmup, None)
            torch.cuda.reset_peak_memory_stats()
            step_s, loss_ms, loss = timed_steps(engine, loss_fn, batch, args.steps, None)
            label = (f"zero{zero} leaf{leaf} flat{flat} on_device_step{on_device} {impl} ckpt={ckpt} compile={comp}"
                     f" loss_graphs<={graphs}")
            if args.profile:
                profile(engine, loss_fn, batch, args.profile, label)
            if args.host_phases:
                row.update(host_phases(engine, loss_fn, batch, args.host_phases))
                print(f"# host ms per step, {label}: " + ", ".join(
                    f"{k[5:-3]} {v:.1f}" for k, v in row.items() if k.startswith("host_")), flush=True)
            if args.sync_points:
                from profile_table import print_host_profile, print_sync_points

                print_sync_points(lambda: timed_steps(engine, loss_fn, batch, args.sync_points, None), label,
                                  args.sync_points)
                print_host_profile(lambda: timed_steps(engine, loss_fn, batch, args.sync_points, None), label,
                                   args.sync_points)
            if impl != PLAIN and graphs:
                from infclip.ops import registered

                captured = [e for e in registered._GRAPHS.calls.values() if e is not None]
                row.update(loss_graphs_captured=len(captured), loss_graphs_failed=len(registered._GRAPHS.calls) - len(captured),
                           loss_graph_replays=sum(e.replays for e in captured))
                print(f"# loss CUDA graphs: {row['loss_graphs_captured']} captured, {row['loss_graphs_failed']} "
                      f"not capturable, {row['loss_graph_replays']} replays", flush=True)
                registered._GRAPHS.clear()
            if impl != PLAIN:
                row["grad_ckpt_resolved"] = bool(engine.module.vision.vision_model.encoder.gradient_checkpointing)
                row["compiled"] = engine.module.compiled
            # samples/s per GPU (the whole job does world_size times this)
            row.update(status="ok", step_ms=step_s * 1e3, samples_per_s=args.micro_batch / step_s,
                       loss_op_ms=loss_ms, peak_mem_gb=(torch.cuda.max_memory_allocated() - floor) / 2**30,
                       loss=loss)
        except torch.OutOfMemoryError:
            row.update(status="oom")
        finally:
            if engine is not None:
                release(engine)
        mfu(row, args)
        report(row, rows, args)


def _flag(text: str):
    return {"on": True, "off": False, "auto": "auto"}[text]


def profile(engine, loss_fn, batch, steps: int, label: str) -> None:
    """Print where a step's host and device time go (torch.profiler, ``steps`` steps)."""
    from profile_table import print_profile

    print_profile(lambda: timed_steps(engine, loss_fn, batch, steps, None), label, steps)


def max_batch(args, rows):
    for spec in args.max_batch_sizes:
        preset, sizes = spec.split(":")
        sizes = [int(s) for s in sizes.split(",")]
        engine = None
        try:
            engine, cfg, loss_fn = build(preset, args.max_batch_zero, args.chunk,
                                         True if args.max_batch_grad_ckpt else "auto", "triton")
            warm = synthetic_batch(2 * args.chunk, cfg, engine.device, torch.bfloat16)
            timed_steps(engine, loss_fn, warm, 2, args.chunk)
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
                    mfu(row, args)
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
    if torch.distributed.get_rank() != 0:
        return
    rows.append(row)
    os.makedirs(os.path.dirname(args.out), exist_ok=True)
    with open(args.out, "a") as f:
        f.write(json.dumps(row) + "\n")
    print(fmt(row), flush=True)


def fmt(r) -> str:
    num = (lambda k, f: format(r[k], f) if isinstance(r.get(k), (int, float)) else "-")
    leaf = {True: "+leaf", False: "-leaf", "stack": "+stack", "tower": "+tower"}.get(r.get("zero3_leaf_layers"), "")
    leaf += f" x{r['world_size']} {r['distributed']}" if r.get("world_size", 1) > 1 else ""
    leaf += {True: " flat", "tower": " flat-tower"}.get(r.get("flat_parameters"), "")
    leaf += " ds-step" if r.get("on_device_step") is False else ""
    leaf += f" ds-waits:{r['zero3_host_waits_kept'].replace(' ', ',')}" if r.get("zero3_host_waits_kept") else ""
    leaf += " ds-timers" if r.get("deepspeed_timers") else ""
    leaf += f" deepcompile:{r['deepcompile']}" if r.get("deepcompile") else ""
    leaf += " conv" if r.get("patch_embedding") == "conv" and r.get("loss_impl") != PLAIN else ""
    leaf += f" patch-dropout:{r['patch_dropout']:g}" if r.get("patch_dropout") else ""
    return (f"{r['study']:<10} {r['model']:<7} zero{r['zero']}{leaf:<5} {r['loss_impl']:<8} B={r['micro_batch']:<6} "
            f"chunk={str(r['chunk']):<5} ckpt={r['grad_ckpt']!s:<5} {r['status']:<7} "
            f"{num('samples_per_s', '9.1f')} samples/s  step {num('step_ms', '10.1f')} ms  "
            f"loss-op {num('loss_op_ms', '8.2f')} ms  peak {num('peak_mem_gb', '6.2f')} GiB  "
            f"MFU {num('mfu', '.1%')} compile={r.get('compile', '-')}")


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--only", choices=["throughput", "max_batch"], default=None)
    p.add_argument("--throughput_model", default="vitb32", choices=sorted(PRESETS))
    p.add_argument("--micro_batch", type=int, default=256)
    p.add_argument("--zero", type=int, nargs="+", default=[2, 3])
    p.add_argument("--impls", nargs="+", default=["triton"], help="loss impls of the pipeline rows")
    p.add_argument("--anchors", nargs="*", default=list(LOOPS), choices=list(LOOPS) + [PLAIN],
                   help="anchors in the same run: the plain PyTorch loop eager/compiled, and "
                   f"{PLAIN!r} (CLIPModel under the pipeline's DeepSpeed config)")
    p.add_argument("--grad_ckpt", nargs="+", default=["auto"], choices=["auto", "on", "off"],
                   help="model.gradient_checkpointing of the pipeline rows")
    p.add_argument("--compile", nargs="+", default=["auto"], choices=["auto", "off"],
                   help="model.compile of the pipeline rows (auto: on, on a GPU)")
    p.add_argument("--zero3_extra", nargs="+", default=["{}"], help="JSON merged into zero_optimization at "
                   "stage 3, e.g. '{\"stage3_param_persistence_threshold\": 1e9}'; several: a ZeRO-3 row each")
    p.add_argument("--zero3_leaf", type=lambda v: {"0": False, "1": True}.get(v, v), nargs="+", default=[True],
                   choices=[False, True, "stack", "tower"], help="ZeRO-3 units (model.zero3_leaf_layers): each "
                   "transformer block (1, the pipeline's default), each tower's stack of blocks (stack), each whole "
                   "tower (tower), or none (0)")
    p.add_argument("--distributed", default="gather", help="loss scheme with several ranks (the vitb32 preset's: "
                   "gather); per-GPU samples/s against a one-GPU run of the same command is the scaling")
    # (the defaults below are the presets' settings, ds_configs/vitb32.json)
    p.add_argument("--compile_mode", default="reduce-overhead", choices=["default", "reduce-overhead",
                                                                         "max-autotune-no-cudagraphs"])
    p.add_argument("--overlap_comm", type=int, default=0, choices=[0, 1], help="zero_optimization.overlap_comm")
    p.add_argument("--flat_parameters", type=lambda v: {"0": False, "1": True}.get(v, v), nargs="+", default=[True],
                   choices=[False, True, "tower"], help="model.flat_parameters of the pipeline rows: 0 1 tower "
                   "runs all three (tower: whole towers, with --grad_ckpt off)")
    p.add_argument("--on_device_step", type=int, nargs="+", default=[1], choices=[0, 1, 2, 3],
                   help="ZeRO-0/1/2 rows: the optimizer step without host waits (pipeline.engine.zero_step, as "
                   "pipeline.train.train builds it) or as DeepSpeed wrote it (0); ZeRO-3 rows: the step with less "
                   "of DeepSpeed's Python and host waits (pipeline.engine.zero3_step) or as written (0), lightened with "
                   "DeepSpeed's host waits kept (2: fetch, norm and epilogue; 3: fetch only); 0 1 runs both "
                   "(ZeRO-0/1/2 rows: one per distinct on/off)")
    p.add_argument("--patch_dropout", type=float, nargs="+", default=[0.0],
                   help="model.patch_dropout of the pipeline rows (FLIP; MFU counts the kept tokens' FLOPs)")
    p.add_argument("--patch_embedding", nargs="+", default=["gemm"], choices=["gemm", "conv"],
                   help="model.patch_embedding of the pipeline rows: gemm conv runs both")
    p.add_argument("--deepcompile", nargs="?", const="default", default="", choices=["", "default", "basic"],
                   help="ZeRO-3 rows: DeepSpeed's DeepCompile (engine.compile() of the whole towers; model.compile "
                   "off) with DeepSpeed's pass schedule, or 'basic': its gathers and releases only")
    p.add_argument("--deepspeed_timers", type=int, default=0, choices=[0, 1],
                   help="1: DeepSpeed's synchronized throughput timer on (its default; the engine turns it off)")
    p.add_argument("--bf16_overflow_check", action="store_true",
                   help="DeepSpeed's bf16.check_grad_overflow (a per-parameter scan and a host sync each step; "
                   "the presets turn it off)")
    p.add_argument("--profile", type=int, default=0, help="profile this many extra steps per throughput row")
    p.add_argument("--sync_points", type=int, default=0,
                   help="after timing, run this many steps listing where the host waits for the GPU, then as many "
                   "under cProfile (host Python time per function)")
    p.add_argument("--host_phases", type=int, default=0,
                   help="time the engine's forward, backward and step on the host over this many extra steps")
    p.add_argument("--loss_graph_max_batch", type=int, nargs="+", default=[DEFAULT_GRAPH_MAX_BATCH],
                   help="contrastive_loss.graph_max_batch of the pipeline rows (0: the loss never replays "
                        "CUDA graphs; default: the config's), a row each")
    p.add_argument("--loss_graph_always", action="store_true",
                   help="the loss replays its CUDA graphs (graph_max_batch > 0) whether or not its stream "
                        "is idle (an experiment: ops/registered._graphed's idle test skipped)")
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
    from infclip.pipeline.train.train import single_process_env

    single_process_env()
    import deepspeed

    deepspeed.init_distributed(dist_backend="nccl")
    torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", 0)))
    if torch.distributed.get_world_size() > 1 and args.anchors:
        args.anchors = []  # the anchors are one-GPU loops: run them in a one-GPU call
        if torch.distributed.get_rank() == 0:
            print("# anchors skipped: several ranks (run them with one GPU)", flush=True)
    torch.backends.cuda.matmul.allow_tf32 = True
    args.tflops = matmul_tflops()
    print(f"# bf16 matmul rate now: {args.tflops:.0f} TFLOP/s", flush=True)
    rows: list = []
    if args.only in (None, "throughput"):
        throughput(args, rows)
    if args.only in (None, "max_batch"):
        max_batch(args, rows)
    print("\n" + "\n".join(fmt(r) for r in rows))
    return 0


if __name__ == "__main__":
    sys.exit(main())
