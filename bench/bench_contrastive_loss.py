"""Forward+backward time and peak extra memory of the contrastive loss op against the anchors.

Anchors, all in the same process and run: the dense bf16 matmul rate (for the roofline
8 B^2 D FLOPs); ``compiled_dense``, torch.compile of the four-line dense CLIP loss (what a user
writes first); ``dense_siglip``, the same for the sigmoid loss; open_clip's ClipLoss and
SigLipLoss; optionally a naive fp32 full-logit loss and inf_cl (two one-direction calls).
open_clip and inf_cl are imported here only (wheels on the device machine).
This op runs as ``ours_bf16`` (CLIP, default settings), ``ours_bf16_banded`` (CLIP,
logits_budget_mb=0: the recompute path at every B) and ``ours_siglip_bf16``; with --unfused also
``ours_bf16_unfused`` / ``ours_siglip_bf16_unfused`` (the recompute path on cuBLAS bands and
Triton passes at every B; the default takes the fused GEMM kernels up to B = 16,384, and for
the backward at every B where they load by TMA descriptors); with --pointer also
``ours_bf16_pointer`` / ``ours_siglip_bf16_pointer`` (the fused kernels with pointer loads, as
on GPUs without TMA); with --keep-mb N also ``ours_bf16_kept`` / ``ours_siglip_bf16_kept`` (logits_budget_mb N: the matrix
kept from forward to backward where it fits, as bf16 bands above the fp32 whole-matrix size);
with --variant LABEL:FIELD=VALUE;... also ``ours_bf16_LABEL`` (and ``ours_siglip_bf16_LABEL`` with
--variant-siglip): the op with those fields of its Tuning (ops/tuning.py; VALUE a Python literal,
or @FILE.json:KEY), set for that run only (forward and backward).

    python bench/bench_contrastive_loss.py --out bench/results/contrastive_loss.jsonl
    TRITON_INTERPRET=1 python bench/bench_contrastive_loss.py --host-only   # CPU, no GPU needed

Rows are appended as JSON lines; a table is printed last (each B: ms, and ours / anchor).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time

import torch
import torch.nn.functional as F

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from infclip.ops import contrastive_loss  # noqa: E402
from infclip.ops.tuning import TUNING, tuning  # noqa: E402
from infclip.pipeline.train.step import OpTimer  # noqa: E402  (CUDA events, read without a device-wide sync)
from gpu_queue import queue_gpu_work, use_gemms  # noqa: E402  (bench/, on sys.path as the script's folder)


def captured(fn, calls: int = 10) -> torch.cuda.CUDAGraph:
    """A CUDA graph of ``calls`` fn() (one eager call first: kernels compiled, handles made)."""
    fn()
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        for _ in range(calls):
            fn()
    return graph


def matmul_tflops_sustained(n: int = 8192, seconds: float = 3.0) -> float:
    """The same GEMM back to back for ``seconds`` (a CUDA graph of ten, replayed): the rate at the
    board's power cap. The roofline uses :func:`matmul_tflops` (short calls from an idle GPU); on an
    H200 this one is ~15% lower (794 against 666 TFLOP/s), and every kernel of a 30-50 ms loss
    call runs at the cap."""
    a = torch.randn(n, n, device="cuda", dtype=torch.bfloat16)
    b = torch.randn(n, n, device="cuda", dtype=torch.bfloat16)
    out = torch.empty_like(a)
    graph = captured(lambda: torch.mm(a, b, out=out))
    start = time.time()
    while time.time() - start < seconds / 2:  # to the cap first
        graph.replay()
        torch.cuda.synchronize()
    t0 = OpTimer(a.device)
    replays, start = 0, time.time()
    while time.time() - start < seconds / 2:
        graph.replay()
        replays += 1
        torch.cuda.synchronize()
    ms = float(t0.stop()) / (10 * replays)
    return 2 * n**3 / (ms * 1e-3) / 1e12


def matmul_tflops(n: int = 8192, reps: int = 10) -> float:
    a = torch.randn(n, n, device="cuda", dtype=torch.bfloat16)
    b = torch.randn(n, n, device="cuda", dtype=torch.bfloat16)
    for _ in range(3):
        a @ b
    times = []
    for _ in range(reps):
        timer = OpTimer(a.device)
        a @ b
        times.append(float(timer.stop()))
    return 2 * n**3 / (statistics.median(times) * 1e-3) / 1e12


def naive_fp32(img, txt, scale):
    logits = scale * img.float() @ txt.float().T
    labels = torch.arange(img.shape[0], device=img.device)
    return 0.5 * (F.cross_entropy(logits, labels) + F.cross_entropy(logits.T, labels))


def make_open_clip():
    from open_clip.loss import ClipLoss

    crit = ClipLoss()
    return lambda img, txt, scale: crit(img, txt, scale.to(img.dtype))


def make_inf_cl():
    import torch.distributed as dist
    from inf_cl import cal_inf_loss

    if not dist.is_initialized():  # inf_cl all-reduces its scale gradient: needs a group
        os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
        os.environ.setdefault("MASTER_PORT", "29533")
        dist.init_process_group("nccl", rank=0, world_size=1)

    def fn(img, txt, scale):
        s = scale.reshape(())
        return 0.5 * (cal_inf_loss(img, txt, scale=s).mean() + cal_inf_loss(txt, img, scale=s).mean())

    return fn


def ours(dtype_mode, loss="clip", fused=True, tma=None, two_pass=False, **kw):
    """This op; fused=False runs the cuBLAS band + Triton pass path (the fused kernels' anchor),
    tma=False the fused kernels with pointer loads (the TMA descriptor kernels' anchor),
    two_pass=True SigLIP's statistics pass in the forward and gradient pass in the backward (the
    anchor of its gradients taken in the forward)."""
    limits = ((TUNING.fused_max_logits, dict(TUNING.tma_max_logits)) if fused
              else (0, dict.fromkeys(TUNING.tma_max_logits, 0)))

    def fn(img, txt, scale, bias):
        TUNING.fused_max_logits, TUNING.tma_max_logits = limits[0], dict(limits[1])
        TUNING.tma_force = tma
        TUNING.siglip_grads_in_forward = not two_pass
        return contrastive_loss(img, txt, scale, bias if loss == "siglip" else None, loss=loss,
                                impl="triton", allow_tf32=(dtype_mode == "tf32"), **kw)
    return fn


def parse_variant(spec: str) -> tuple[str, dict]:
    """``LABEL:FIELD=VALUE;FIELD=VALUE`` -> (LABEL, {FIELD: value}); VALUE a Python literal or
    @FILE.json:KEY (lists become tuples)."""
    import ast

    label, _, body = spec.partition(":")
    settings = {}
    for item in [x for x in body.split(";") if x.strip()]:
        attr, _, value = item.partition("=")
        if value.startswith("@"):
            path, _, key = value[1:].rpartition(":")
            with open(path) as f:
                v = json.load(f)[key]
        else:
            v = ast.literal_eval(value)
        settings[attr.strip()] = tuple(v) if isinstance(v, list) else v
    return label, settings


def _dense_clip(img, txt, scale):
    logits = scale * (img @ txt.T)
    labels = torch.arange(img.shape[0], device=img.device)
    return 0.5 * (F.cross_entropy(logits, labels) + F.cross_entropy(logits.T, labels))


def _dense_siglip(img, txt, scale, bias):
    logits = scale * (img @ txt.T) + bias
    n = img.shape[0]
    signs = 2 * torch.eye(n, device=img.device, dtype=logits.dtype) - 1
    return -F.logsigmoid(signs * logits).sum() / n


def make_compiled_dense():
    """torch.compile of the dense CLIP loss: bf16 GEMM, times the fp32 [1] scale (fp32 logits, as
    users write it; BENCHMARKS.md's anchor, 16 GiB at B = 65,536)."""
    fn = torch.compile(_dense_clip, dynamic=False)
    return lambda img, txt, scale, bias: fn(img, txt, scale)


def make_dense_siglip():
    fn = torch.compile(_dense_siglip, dynamic=False)
    return fn


def make_open_clip_siglip():
    from open_clip.loss import SigLipLoss

    crit = SigLipLoss()
    return lambda img, txt, scale, bias: crit(img, txt, scale.to(img.dtype), bias.to(img.dtype))


def inputs(b, d, dtype, device="cuda"):
    """The benchmark's inputs at B = ``b``: L2-normalised features [b, d] in ``dtype`` (seed 0),
    scale 14.3 and bias -10 ([1], fp32), all requiring gradients, on ``device``."""
    gen = torch.Generator(device=device).manual_seed(0)
    img = F.normalize(torch.randn(b, d, device=device, generator=gen), dim=-1).to(dtype).requires_grad_()
    txt = F.normalize(torch.randn(b, d, device=device, generator=gen), dim=-1).to(dtype).requires_grad_()
    scale = torch.full((1,), 14.3, device=device, requires_grad=True)
    bias = torch.full((1,), -10.0, device=device, requires_grad=True)
    return img, txt, scale, bias


def timed_call(fn, img, txt, scale, bias, queued_ms: float = 0.0):
    """(ms, loss) of one forward + backward of ``fn`` by CUDA events, its timer starting behind
    ``queued_ms`` of queued GPU work (0: none); the inputs' gradients are dropped after it."""
    queue_gpu_work(queued_ms, img.device)
    timer = OpTimer(img.device)
    loss = fn(img, txt, scale, bias)
    loss.backward()
    ms = float(timer.stop())
    img.grad = txt.grad = scale.grad = bias.grad = None
    return ms, loss.detach()


def measure(fn, b, d, dtype, reps, warmup=2, queued_ms=0.0):
    """(median fwd+bwd ms, peak memory above the inputs in GiB, loss, memory held between calls
    in GiB), or a status string ("oom", "error: ..."). ``queued_ms``: that much GPU work (a sleep
    kernel) is queued before each timed call and the timer starts behind it, as in training,
    where the loss follows the towers' forward (host work is then hidden unless the call waits on
    the GPU). Held: what the warm-up calls left reserved (CUDA graphs' buffers and pools)."""
    from infclip.ops import registered

    registered._GRAPHS.clear()  # held: this row's CUDA graphs only
    torch.cuda.empty_cache()
    img, txt, scale, bias = inputs(b, d, dtype)
    try:
        torch.cuda.synchronize()
        reserved = torch.cuda.memory_reserved()
        for _ in range(warmup):
            fn(img, txt, scale, bias).backward()
            img.grad = txt.grad = scale.grad = bias.grad = None
        torch.cuda.synchronize()
        torch.cuda.empty_cache()
        held = (torch.cuda.memory_reserved() - reserved) / 2**30
        torch.cuda.reset_peak_memory_stats()
        base = torch.cuda.memory_allocated()
        times = []
        for _ in range(reps):
            ms, loss = timed_call(fn, img, txt, scale, bias, queued_ms)
            times.append(ms)
        peak = (torch.cuda.max_memory_allocated() - base) / 2**30
        return statistics.median(times), peak, float(loss), held
    except torch.OutOfMemoryError:
        return "oom"
    except Exception as exc:  # an anchor failing must not end the run
        print(f"# error: {type(exc).__name__}: {exc}", flush=True)
        return f"error: {type(exc).__name__}"
    finally:
        del img, txt, scale, bias
        torch.cuda.empty_cache()


def profile(fn, b, d, dtype, path):
    """Kernel-level table of one fwd+bwd (after warm-up) into ``path``: where the time goes."""
    from torch.profiler import ProfilerActivity
    from torch.profiler import profile as torch_profile

    img, txt, scale, bias = inputs(b, d, dtype)
    for _ in range(3):
        fn(img, txt, scale, bias).backward()
    torch.cuda.synchronize()
    with torch_profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
        for _ in range(3):
            fn(img, txt, scale, bias).backward()
        torch.cuda.synchronize()
    with open(path, "a") as f:
        f.write(f"\n## B = {b}, 3 calls\n")
        f.write(prof.key_averages().table(sort_by="cuda_time_total", row_limit=18,
                                          max_name_column_width=70))


def host_profile(fn, b, d, calls=20):
    """cProfile of ``calls`` forward + backward calls at B = ``b`` (after warm-up): the op's host
    time by function, which is what bounds it at small B."""
    from profile_table import print_host_profile

    img, txt, scale, bias = inputs(b, d, torch.bfloat16)

    def run():
        for _ in range(calls):
            fn(img, txt, scale, bias).backward()
        torch.cuda.synchronize()

    run()
    print_host_profile(run, f"ours_bf16 B = {b}", calls, rows=25)


class _NoLaunch:
    """Stands in for a Triton kernel: ``kernel[grid](...)`` returns at once (nothing written)."""

    def __getitem__(self, grid):
        return lambda *args, **kwargs: None


def host_only(b, d, calls):
    """Per-call host time of the op's Python layers on the CPU, without a GPU: forward +
    backward at B = ``b`` (fp32, impl triton with every Triton launch stubbed out, so the
    outputs are garbage and only the Python around the kernels is timed: the public function's
    checks, the registered op's dispatch and autograd, the launch wrappers' argument handling
    and the small torch ops). Triton's own launch path (JITFunction.run: argument binding,
    specialisation, cache lookup, the driver call) needs a GPU and is not in these numbers;
    CPU tensor ops cost about half what a CUDA launch does on the host, and the GEMMs of B = ``b``
    take a few microseconds. Prints the best of 5 runs of ``calls`` calls, in microseconds."""
    if os.environ.get("TRITON_INTERPRET") != "1":
        raise SystemExit("--host-only needs TRITON_INTERPRET=1 in the environment (CPU Triton)")
    from infclip.ops import contrastive_loss_triton as tri

    for name, value in list(vars(tri).items()):
        if name.endswith("_kernel") and hasattr(value, "__getitem__"):  # the launchable kernels
            setattr(tri, name, _NoLaunch())
    img, txt, scale, bias = inputs(b, d, torch.float32, device="cpu")
    for loss in ("clip", "siglip"):
        for budget, label in ((64.0, "kept"), (0.0, "recompute")):
            def call():
                out = contrastive_loss(img, txt, scale, bias if loss == "siglip" else None, loss=loss,
                                       impl="triton", triton_interpret=True, logits_budget_mb=budget)
                out.backward()
                img.grad = txt.grad = scale.grad = bias.grad = None

            for _ in range(20):
                call()
            runs = []
            for _ in range(5):
                t0 = time.perf_counter()
                for _ in range(calls):
                    call()
                runs.append((time.perf_counter() - t0) / calls * 1e6)
            print(f"# host only (CPU, Triton launches stubbed): {loss} {label} B = {b}, D = {d}: "
                  f"{min(runs):.1f} us per forward + backward", flush=True)


def interleaved(fns: dict, b: int, d: int, rounds: int, warmup: int = 3) -> dict:
    """Per impl of ``fns`` (name -> fn, bf16), the forward + backward times (ms, as in
    :func:`measure`, each call on an idle GPU) of ``rounds`` rounds in which every impl runs once,
    in turn: host drift (clock boost, other processes) then reaches every impl alike, where
    :func:`measure`'s block of calls per impl takes it whole. The order rotates from round to
    round, so that no impl always follows the same one (the dense losses free 4-32 GiB at
    32k-65k). Returns name -> list of times, round by round (a paired ratio per round is then
    robust to the drift)."""
    from infclip.ops import registered

    registered._GRAPHS.clear()
    img, txt, scale, bias = inputs(b, d, torch.bfloat16)
    times = {name: [] for name in fns}
    names = list(fns)
    for r in range(warmup + rounds):
        for name in names[r % len(names):] + names[:r % len(names)]:
            torch.cuda.synchronize()
            ms, _ = timed_call(fns[name], img, txt, scale, bias)
            if r >= warmup:
                times[name].append(ms)
    del img, txt, scale, bias
    torch.cuda.empty_cache()
    return times


def interleaved_table(times: dict, b: int, pairs: dict, meta: dict, out: str) -> None:
    """Rows (``mode: interleaved``) and a table: median, quartiles, and for each of ``pairs``
    (ours -> its anchor) the median of the per-round ratios."""
    q = lambda xs, f: sorted(xs)[min(len(xs) - 1, int(f * len(xs)))]
    for name, xs in times.items():
        row = dict(meta, impl=name, B=b, mode="interleaved", rounds=len(xs), ms=round(statistics.median(xs), 3),
                   p25=round(q(xs, 0.25), 3), p75=round(q(xs, 0.75), 3))
        if name in pairs and pairs[name] in times:
            ratios = [x / y for x, y in zip(xs, times[pairs[name]])]
            row.update(anchor=pairs[name], paired_ratio=round(statistics.median(ratios), 3),
                       rounds_faster=sum(r < 1 for r in ratios))
        print(json.dumps(row), flush=True)
        with open(out, "a") as f:
            f.write(json.dumps(row) + "\n")
        vs = (f"{row['paired_ratio']:.2f}x {row['anchor']} (faster in {row['rounds_faster']} of {len(xs)} rounds)"
              if "paired_ratio" in row else "")
        print(f"# interleaved B={b:,} {name}: median {row['ms']:.3f} ms (p25 {row['p25']:.3f}, p75 {row['p75']:.3f}) "
              f"{vs}", flush=True)


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--sizes", default="1024,2048,4096,8192,16384,32768,65536")
    p.add_argument("--big", default="262144", help="sizes run for this project only")
    p.add_argument("--dim", type=int, default=768)
    p.add_argument("--anchor-max", type=int, default=65536, help="largest B for the anchors")
    p.add_argument("--fp32-max", type=int, default=0, help="largest B for the fp32 modes")
    p.add_argument("--anchors", default="compiled_dense,dense_siglip,open_clip,open_clip_siglip",
                   help="any of compiled_dense, dense_siglip, open_clip, open_clip_siglip, naive, inf_cl")
    p.add_argument("--reps", type=int, default=7)
    p.add_argument("--queued-ms", type=float, default=0.0,
                   help="GPU work queued before each timed call, the timer starting behind it (the "
                        "towers' forward in training); 0: each call starts on an idle GPU")
    p.add_argument("--queued-work", choices=("sleep", "gemm"), default="sleep",
                   help="what --queued-ms queues: a sleep kernel, or bf16 GEMMs (the GPU at its power cap, as "
                   "behind the towers' matmuls)")
    p.add_argument("--profile", default="", help="B values whose kernel table (ours and the compiled dense "
                   "anchors) goes to --profile-out")
    p.add_argument("--profile-out", default="contrastive_loss_profile.txt")
    p.add_argument("--host-profile", type=int, default=0,
                   help="B at which to print where the op's host time goes (cProfile of 20 forward + backward calls)")
    p.add_argument("--out", default="bench/results/contrastive_loss.jsonl")
    p.add_argument("--tiles", default="", help="JSON of the fused kernels' tiles (bench_loss_kernels.py --best)")
    p.add_argument("--unfused", action="store_true", help="also the cuBLAS band + Triton pass path")
    p.add_argument("--pointer", action="store_true",
                   help="also the fused kernels with pointer loads instead of TMA descriptors")
    p.add_argument("--eager", action="store_true",
                   help="also this op with its CUDA-graph replay off (graph_max_batch=0)")
    p.add_argument("--graph-max-batch", type=int, default=0,
                   help="also this op with this graph_max_batch (rows _graphed)")
    p.add_argument("--keep-mb", type=float, default=0.0,
                   help="also ours_bf16_kept / ours_siglip_bf16_kept: logits_budget_mb of this many MiB "
                   "(the matrix kept from forward to backward where it fits)")
    p.add_argument("--siglip-two-pass", action="store_true",
                   help="also ours_siglip_bf16_two_pass: SigLIP's statistics pass in the forward, its "
                   "gradient pass in the backward (before the gradients moved into the forward)")
    p.add_argument("--variant", action="append", default=[],
                   help="LABEL:FIELD=VALUE;FIELD=VALUE: also ours_bf16_LABEL, the op with these fields of its "
                   "Tuning (ops/tuning.py; VALUE: a Python literal or @FILE.json:KEY); repeatable")
    p.add_argument("--variant-siglip", action="store_true", help="the --variant runs for SigLIP too")
    p.add_argument("--variant-kept", action="store_true",
                   help="the --variant runs with logits_budget_mb=--keep-mb (the matrix kept) instead of the default")
    p.add_argument("--interleave", type=int, default=0,
                   help="also, for each B up to --interleave-max, this many rounds calling ours_bf16, "
                   "ours_siglip_bf16, compiled_dense and dense_siglip in turn on an idle GPU (rows with "
                   "mode 'interleaved': medians and per-round paired ratios against the dense anchors)")
    p.add_argument("--interleave-max", type=int, default=16384)
    p.add_argument("--host-only", action="store_true",
                   help="CPU only (TRITON_INTERPRET=1): time the op's Python layers with the Triton launches stubbed")
    args = p.parse_args(argv)
    use_gemms(args.queued_work == "gemm")
    if args.host_only:
        host_only(32, 16, 500)
        return
    torch._dynamo.config.cache_size_limit = 64  # one compiled graph per B (dynamic=False)
    if args.tiles:
        with open(args.tiles) as f:
            tiles = json.load(f)
        TUNING.fused_stats, TUNING.fused_grad = tuple(tiles["stats"]), tuple(tiles["grad"])
        print(f"# fused tiles: stats {TUNING.fused_stats}, grad {TUNING.fused_grad}", flush=True)

    dev = torch.cuda.get_device_name()
    import triton

    tflops = matmul_tflops()
    sustained = matmul_tflops_sustained()
    meta = dict(gpu=dev, torch=torch.__version__, triton=triton.__version__, dim=args.dim,
                matmul_tflops=round(tflops, 1), matmul_tflops_sustained=round(sustained, 1),
                date=time.strftime("%Y-%m-%d"), queued_ms=args.queued_ms, queued_work=args.queued_work)
    print(f"# {dev}, torch {torch.__version__}, triton {triton.__version__}, bf16 matmul {tflops:.0f} TFLOP/s "
          f"(the roofline's; sustained at the power cap: {sustained:.0f})", flush=True)

    anchors = {}
    for name in [a for a in args.anchors.split(",") if a]:
        try:
            anchors[name] = {"naive": lambda: (lambda i, t, s, b: naive_fp32(i, t, s)),
                             "open_clip": lambda: (lambda f: lambda i, t, s, b: f(i, t, s))(make_open_clip()),
                             "inf_cl": lambda: (lambda f: lambda i, t, s, b: f(i, t, s))(make_inf_cl()),
                             "compiled_dense": make_compiled_dense,
                             "dense_siglip": make_dense_siglip,
                             "open_clip_siglip": make_open_clip_siglip}[name]()
        except Exception as exc:  # a missing wheel must not stop the run
            print(f"# anchor {name} unavailable: {exc}", flush=True)

    rows = []
    sizes = [int(x) for x in args.sizes.split(",") if x] + [int(x) for x in args.big.split(",") if x]
    for b in sizes:
        roof = 8 * b * b * args.dim / (tflops * 1e12) * 1e3
        runs = [("ours_bf16", ours("bf16"), torch.bfloat16),
                ("ours_bf16_banded", ours("bf16", logits_budget_mb=0), torch.bfloat16),
                ("ours_siglip_bf16", ours("bf16", "siglip"), torch.bfloat16)]
        if args.eager:
            runs += [("ours_bf16_eager", ours("bf16", graph_max_batch=0), torch.bfloat16),
                     ("ours_siglip_bf16_eager", ours("bf16", "siglip", graph_max_batch=0), torch.bfloat16)]
        if args.graph_max_batch:
            runs += [("ours_bf16_graphed", ours("bf16", graph_max_batch=args.graph_max_batch), torch.bfloat16),
                     ("ours_siglip_bf16_graphed", ours("bf16", "siglip", graph_max_batch=args.graph_max_batch),
                      torch.bfloat16)]
        if args.keep_mb:
            runs += [("ours_bf16_kept", ours("bf16", logits_budget_mb=args.keep_mb), torch.bfloat16),
                     ("ours_siglip_bf16_kept", ours("bf16", "siglip", logits_budget_mb=args.keep_mb),
                      torch.bfloat16)]
        if args.pointer:
            runs += [("ours_bf16_pointer", ours("bf16", tma=False), torch.bfloat16),
                     ("ours_siglip_bf16_pointer", ours("bf16", "siglip", tma=False), torch.bfloat16)]
        if args.siglip_two_pass:
            runs.append(("ours_siglip_bf16_two_pass", ours("bf16", "siglip", two_pass=True), torch.bfloat16))
        if args.unfused:
            runs += [("ours_bf16_unfused", ours("bf16", fused=False, logits_budget_mb=0), torch.bfloat16),
                     ("ours_siglip_bf16_unfused", ours("bf16", "siglip", fused=False), torch.bfloat16)]
        for spec in args.variant:
            label, settings = parse_variant(spec)
            with tuning(**settings):  # (ours() takes the fused kernels' limits as they are then)
                kept = {"logits_budget_mb": args.keep_mb} if args.variant_kept else {}
                runs.append((f"ours_bf16_{label}", ours("bf16", **kept), torch.bfloat16, settings))
                if args.variant_siglip:
                    runs.append((f"ours_siglip_bf16_{label}", ours("bf16", "siglip", **kept), torch.bfloat16,
                                 settings))
        if b <= args.fp32_max:
            runs += [("ours_fp32", ours("ieee"), torch.float32), ("ours_tf32", ours("tf32"), torch.float32)]
        if b <= args.anchor_max:
            for name, fn in anchors.items():
                runs.append((name, fn, torch.float32 if name == "naive" else torch.bfloat16))
        for name, fn, dtype, *settings in runs:
            reps = args.reps if (b <= 65536 or name.startswith("ours")) else 2
            reps = 3 if b >= 1_000_000 else reps
            with tuning(**(settings[0] if settings else {})):
                res = measure(fn, b, args.dim, dtype, reps, warmup=1 if b >= 262144 else 2,
                              queued_ms=args.queued_ms)
            row = dict(meta, impl=name, B=b, dtype=str(dtype).replace("torch.", ""),
                       roofline_ms=round(roof, 3))
            if settings:
                row["settings"] = {k: repr(v) for k, v in settings[0].items()}
            if isinstance(res, str):
                row.update(status=res)
            else:
                ms, peak, loss, held = res
                row.update(status="ok", ms=round(ms, 3), peak_extra_gib=round(peak, 3), loss=loss,
                           held_gib=round(held, 3),
                           x_roofline=round(ms / roof, 2),
                           mem_bar_gib=round((3 * b * args.dim * 4) / 2**30, 3))
            rows.append(row)
            print(json.dumps(row), flush=True)
            with open(args.out, "a") as f:
                f.write(json.dumps(row) + "\n")

    for b in (sizes if args.interleave else []):
        if b > args.interleave_max:
            continue
        fns = {"ours_bf16": ours("bf16"), "ours_siglip_bf16": ours("bf16", "siglip"),
               **{a: anchors[a] for a in ("compiled_dense", "dense_siglip") if a in anchors}}
        interleaved_table(interleaved(fns, b, args.dim, args.interleave), b,
                          {"ours_bf16": "compiled_dense", "ours_siglip_bf16": "dense_siglip"}, meta, args.out)

    for b in [int(x) for x in args.profile.split(",") if x]:
        for name, fn in (("ours_bf16", ours("bf16")), ("ours_siglip_bf16", ours("bf16", "siglip")),
                         *((a, anchors[a]) for a in ("compiled_dense", "dense_siglip") if a in anchors)):
            with open(args.profile_out, "a") as f:
                f.write(f"\n# {name}")
            profile(fn, b, args.dim, torch.bfloat16, args.profile_out)

    if args.host_profile:
        host_profile(ours("bf16"), args.host_profile, args.dim)

    print("\n| B | impl | dtype | ms | x roofline | peak extra GiB | held GiB | ours / this | this / its dense anchor |")
    print("|---|---|---|---|---|---|---|---|---|")
    by_b = {}
    for r in rows:
        if r["status"] == "ok":
            by_b.setdefault(r["B"], {})[r["impl"]] = r["ms"]
    for r in rows:
        if r["status"] == "ok":
            mine = by_b[r["B"]].get("ours_siglip_bf16" if "siglip" in r["impl"] else "ours_bf16")
            ratio = f"{mine / r['ms']:.2f}" if mine and not r["impl"].startswith("ours") else ""
            dense = by_b[r["B"]].get("dense_siglip" if "siglip" in r["impl"] else "compiled_dense")
            vs_dense = f"{r['ms'] / dense:.2f}" if dense and r["impl"].startswith("ours") else ""
            print(f"| {r['B']:,} | {r['impl']} | {r['dtype']} | {r['ms']:.2f} | {r['x_roofline']} | "
                  f"{r['peak_extra_gib']:.2f} | {r['held_gib']:.2f} | {ratio} | {vs_dense} |")
        else:
            print(f"| {r['B']:,} | {r['impl']} | {r['dtype']} | {r['status']} | | | | | |")


if __name__ == "__main__":
    main()
