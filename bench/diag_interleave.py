"""Why the op's idle-GPU time at B = 32,768 spreads when it alternates with the dense losses
(h200_eg: CLIP median 14.8 ms, quartiles 13.5 / 17.6, against 13.5 in a block of its own calls):
the raw times of ours alone, then alternating with compiled_dense, then with dense_siglip, each
call on an idle GPU, with the GPU's SM clock read after each call (NVML, when pynvml is there)
and the garbage collections of each generation during each of ours (gc.callbacks); ``--gc``
freezes the objects made so far first (gc.freeze: the collector no longer walks them) or turns
the collector off.

    python bench/diag_interleave.py --b 32768 --rounds 30 --gc auto freeze off
"""

from __future__ import annotations

import argparse
import gc
import os
import statistics
import sys

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from bench_contrastive_loss import inputs, make_compiled_dense, make_dense_siglip, ours, timed_call  # noqa: E402


def _clock():
    try:
        import pynvml

        pynvml.nvmlInit()
        handle = pynvml.nvmlDeviceGetHandleByIndex(torch.cuda.current_device())
        return lambda: pynvml.nvmlDeviceGetClockInfo(handle, pynvml.NVML_CLOCK_SM)
    except Exception:  # no NVML bindings: no clock column
        return lambda: -1


_COLLECTED = [0, 0, 0]


def _count(phase, info) -> None:
    if phase == "start":
        _COLLECTED[info["generation"]] += 1


def call(fn, img, txt, scale, bias) -> float:
    """ms of one forward + backward started on an idle GPU."""
    torch.cuda.synchronize()
    return timed_call(fn, img, txt, scale, bias)[0]


def main(argv=None) -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--b", type=int, default=32768)
    p.add_argument("--dim", type=int, default=768)
    p.add_argument("--rounds", type=int, default=30)
    p.add_argument("--gc", nargs="+", default=["auto"], choices=["auto", "freeze", "off"])
    args = p.parse_args(argv)
    clock = _clock()
    gc.callbacks.append(_count)
    img, txt, scale, bias = inputs(args.b, args.dim, torch.bfloat16)
    fns = {"ours": ours("bf16"), "compiled_dense": make_compiled_dense(), "dense_siglip": make_dense_siglip()}
    for fn in fns.values():
        for _ in range(2):
            call(fn, img, txt, scale, bias)
    print(f"# objects tracked by the collector: {len(gc.get_objects()):,}", flush=True)
    for mode in args.gc:
        if mode == "freeze":
            gc.freeze()
        elif mode == "off":
            gc.disable()
        for label, order in (("ours alone", ["ours"]), ("ours / compiled_dense", ["ours", "compiled_dense"]),
                             ("ours / dense_siglip", ["ours", "dense_siglip"])):
            label = f"gc {mode}, {label}"
            times = {name: [] for name in order}
            clocks, collected = [], []
            for _ in range(args.rounds):
                for name in order:
                    before = list(_COLLECTED)
                    times[name].append(call(fns[name], img, txt, scale, bias))
                    if name == "ours":
                        clocks.append(clock())
                        collected.append("".join(str(g) * (a - b) for g, (a, b) in
                                                 enumerate(zip(_COLLECTED, before))) or "-")
            for name, xs in times.items():
                print(f"{label}: {name} median {statistics.median(xs):.2f} ms, min {min(xs):.2f}, "
                      f"max {max(xs):.2f}; " + " ".join(f"{x:.1f}" for x in xs), flush=True)
            print(f"{label}: collections (generations) during ours " + " ".join(collected), flush=True)
            print(f"{label}: SM MHz after ours " + " ".join(map(str, clocks)), flush=True)
        gc.unfreeze()
        gc.enable()


if __name__ == "__main__":
    main()
