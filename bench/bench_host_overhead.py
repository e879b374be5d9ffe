"""DeepSpeed's host time per training step against the number of parameter tensors.

    python bench/bench_host_overhead.py                  # CPU (gloo, one process) or one GPU

A profile of the ViT-B/32 step at micro-batch 256 finds the step bound by the host:
ZeRO-2 hooks, copies and norms run once per parameter tensor (399 in the two towers). This
benchmark isolates that cost: a model of ``--numel`` elements split into N tensors, a forward that
costs almost nothing (one reduction per tensor), and the DeepSpeed step (bf16, ZeRO stage as
given, torch AdamW). Time per step for N = 399 (the towers' layout) and for fewer, larger tensors
(what flat per-block parameters would give: two per transformer block plus a few) measures
what the per-tensor work costs on this host; the ``plain torch`` row (no DeepSpeed) is the part
that any trainer pays for the same tensors. Rows are printed (no file).
"""

from __future__ import annotations

import argparse
import logging
import os
import sys
import time
from typing import Callable

import torch

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


class Split(torch.nn.Module):
    """``numel`` parameters in ``count`` equal 1-D tensors; the forward is their sum times x."""

    def __init__(self, count: int, numel: int) -> None:
        super().__init__()
        size = numel // count
        self.parts = torch.nn.ParameterList([torch.nn.Parameter(torch.randn(size) * 0.01) for _ in range(count)])

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.stack([p.sum() for p in self.parts]).sum() * x


def _ms_per_step(step: Callable[[], object], steps: int, device: torch.device) -> float:
    """Mean wall time of ``step()`` over ``steps`` calls after 3 warm-up calls, the device
    synchronised at both ends."""
    for _ in range(3):
        step()
    if device.type == "cuda":
        torch.cuda.synchronize()
    t0 = time.perf_counter()
    for _ in range(steps):
        step()
    if device.type == "cuda":
        torch.cuda.synchronize()
    return (time.perf_counter() - t0) / steps * 1e3


def _deepspeed_ms(model: torch.nn.Module, params, micro: int, zero_optimization: dict, loss: Callable,
                  steps: int, device: torch.device, after_init: Callable = lambda engine: None) -> float:
    """``_ms_per_step`` of a DeepSpeed engine (bf16, torch AdamW) taking ``loss(engine)``;
    ``after_init(engine)`` runs once the engine is built."""
    import deepspeed

    ds = {"train_micro_batch_size_per_gpu": micro, "bf16": {"enabled": True, "check_grad_overflow": False},
          "optimizer": {"type": "AdamW", "params": {"lr": 1e-4, "torch_adam": True}},
          "zero_optimization": zero_optimization}
    engine, *_ = deepspeed.initialize(model=model, model_parameters=params, config=ds)
    after_init(engine)

    def step():
        engine.backward(loss(engine))
        engine.step()

    try:
        return _ms_per_step(step, steps, device)
    finally:
        engine.destroy()


def step_ms(count: int, numel: int, zero: int, overlap: bool, steps: int, device: torch.device) -> float:
    model = Split(count, numel)
    x = torch.ones((), dtype=torch.bfloat16, device=device)
    return _deepspeed_ms(model, model.parameters(), 1,
                         {"stage": zero, "overlap_comm": overlap, "contiguous_gradients": True},
                         lambda engine: engine(x), steps, device)


def plain_ms(count: int, numel: int, steps: int, device: torch.device) -> float:
    """The same model and step without DeepSpeed (bf16 weights, torch AdamW with foreach): the
    forward, backward and update alone, the part of the time that any trainer pays."""
    model = Split(count, numel).to(device=device, dtype=torch.bfloat16)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4, foreach=True)
    x = torch.ones((), dtype=torch.bfloat16, device=device)

    def step():
        model(x).backward()
        opt.step()
        opt.zero_grad(set_to_none=True)

    return _ms_per_step(step, steps, device)


def towers_ms(flat, zero: int, steps: int, device: torch.device, width: int, leaf=True,
              lighten: bool = False) -> tuple:
    """The ViT-B/32 towers' layout (12 + 12 blocks, 399 tensors) at width ``width``, with or
    without ``model.flat_parameters`` (True: per block, "tower": per tower), through the DeepSpeed
    step on 2 rows: (tensors, ms).
    Under ZeRO-3, ``leaf`` is ``model.zero3_leaf_layers`` (True: each block, "stack": each
    tower's stack of blocks, "tower": each tower, False: none), and ``lighten`` applies ``pipeline.engine.zero3_step``
    (False: DeepSpeed's ZeRO-3 step as written, restored if an earlier engine replaced it)."""
    from infclip.pipeline.engine.tower_unit import reduce_when_accumulated
    from infclip.pipeline.engine.zero3_step import lighten_zero3, restore_deepspeed_zero3

    from infclip.pipeline.model.config import ModelConfig
    from infclip.pipeline.model.model import CLIPTowers
    from infclip.pipeline.model.param_layout import mark_zero3_leaf_layers, param_groups

    heads = max(1, width // 64)
    cfg = ModelConfig.from_dict({
        "embed_dim": width, "flat_parameters": flat, "compile": False, "gradient_checkpointing": False,
        "vision": {"image_size": 64, "patch_size": 32, "hidden_size": width, "layers": 12, "heads": heads},
        "text": {"context_length": 8, "hidden_size": width, "layers": 12, "heads": heads, "vocab_size": 64}})
    torch.manual_seed(0)
    model = CLIPTowers(cfg, eos_token_id=1, pad_token_id=0)
    pixels = torch.randn(2, 3, 64, 64, device=device, dtype=torch.bfloat16)
    ids = torch.randint(3, 64, (2, 8), device=device)

    def loss(engine):
        img, txt, scale, _ = engine(pixels, ids, torch.ones_like(ids))
        return (scale * img @ txt.T).float().logsumexp(1).mean()

    count = len(list(model.parameters()))
    if zero == 3 and leaf:
        mark_zero3_leaf_layers(model, leaf)
    def after_init(engine):
        engine.module.bind_flat_views_in_forward()
        if lighten and not lighten_zero3(engine):
            raise RuntimeError("pipeline.engine.zero3_step refused this engine (debug log says why)")
        if zero == 3:
            reduce_when_accumulated(engine)  # (tower units only)

    if not lighten:
        restore_deepspeed_zero3()
    return count, _deepspeed_ms(model, param_groups(model), 2, {"stage": zero}, loss, steps, device, after_init)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--counts", nargs="+", type=int, default=[399, 54, 8], help="parameter tensors")
    p.add_argument("--numel", type=int, default=399 * 4096, help="elements in all (small: the host cost shows)")
    p.add_argument("--zero", nargs="+", type=int, default=[1, 2, 3])
    p.add_argument("--steps", type=int, default=10)
    p.add_argument("--towers", action="store_true",
                   help="instead: the ViT-B/32 towers' layout (narrow) without and with model.flat_parameters "
                        "(per block, per tower)")
    p.add_argument("--width", type=int, default=64, help="--towers: hidden size of both towers")
    p.add_argument("--zero3_leaf", type=lambda v: {"0": False, "1": True}.get(v, v), nargs="+",
                   default=[True, "stack"], choices=[False, True, "stack", "tower"],
                   help="--towers at ZeRO-3: model.zero3_leaf_layers values (1: blocks, stack, tower, 0: none)")
    p.add_argument("--lighten", type=int, nargs="+", default=[0], choices=[0, 1],
                   help="--towers at ZeRO-3: without (0) / with (1) pipeline.engine.zero3_step, one row each in this "
                        "order (e.g. 0 1 0 1: compared within one process)")
    args = p.parse_args(argv)
    from infclip.pipeline.train.train import single_process_env

    single_process_env()
    logging.getLogger("DeepSpeed").setLevel(logging.ERROR)
    device = torch.device("cuda", 0) if torch.cuda.is_available() else torch.device("cpu")
    if args.towers:
        print(f"# {device}, {os.cpu_count()} CPUs, ViT-B/32 layout at width {args.width}; ms per DeepSpeed step")
        for zero in args.zero:
            for flat in (False, True, "tower"):
                for leaf in (args.zero3_leaf if zero == 3 else [True]):
                    if flat == "tower" and zero == 3 and leaf != "tower":
                        continue  # flat towers are ZeRO-3's units
                    for lighten in (args.lighten if zero == 3 else [0]):
                        count, ms = towers_ms(flat, zero, args.steps, device, args.width, leaf, bool(lighten))
                        unit = {True: " blocks", False: " no leaf", "stack": " stacks", "tower": " towers"}[leaf] if zero == 3 else ""
                        unit += " lightened" if lighten else ""
                        layout = {False: "plain", True: "flat_parameters", "tower": "flat towers"}[flat]
                        print(f"ZeRO-{zero}{unit:<18} {layout:<16} {count:>4} tensors "
                              f"{ms:7.1f}", flush=True)
        return 0
    print(f"# {device}, {os.cpu_count()} CPUs, {args.numel:,} elements; ms per step (forward + backward + step)")
    row = lambda label, ms: print(f"{label:<22}" + "  ".join(f"{n:>4} tensors {m:7.1f}" for n, m in zip(args.counts, ms)),
                                  flush=True)
    row("plain torch", [plain_ms(n, args.numel, args.steps, device) for n in args.counts])
    for zero in args.zero:
        for overlap in ([False, True] if zero == 2 else [False]):
            row(f"ZeRO-{zero}" + (" overlap_comm" if overlap else ""),
                [step_ms(n, args.numel, zero, overlap, args.steps, device) for n in args.counts])
    return 0


if __name__ == "__main__":
    sys.exit(main())
