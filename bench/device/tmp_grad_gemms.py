"""Device-only (h200_fy, deleted after): the backward's two gradient GEMMs of one block (dI rows += P @ B_block,
dT rows += P^T @ A_band, bf16 in, fp32 sums) at the op's block shapes, alone, one after the other, and on two
streams (fork / join by events), GPU time by CUDA-graph replay."""
import os, sys
import torch
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from diag_gluon_grad import graph_timed

d = 768
side = torch.cuda.Stream()
for rows, cols in ((4096, 4096), (8192, 4096), (8192, 8192)):
    g = torch.Generator(device="cuda").manual_seed(0)
    p = torch.randn(rows, cols, device="cuda", generator=g).bfloat16()
    a = torch.randn(rows, d, device="cuda", generator=g).bfloat16()
    b = torch.randn(cols, d, device="cuda", generator=g).bfloat16()
    acc_a = torch.zeros(rows, d, device="cuda")
    acc_b = torch.zeros(cols, d, device="cuda")
    gf = 2 * rows * cols * d / 1e9

    def di():
        torch.addmm(acc_a, p, b, out_dtype=torch.float32, out=acc_a)

    def dt():
        torch.addmm(acc_b, p.T, a, out_dtype=torch.float32, out=acc_b)

    def both():
        di(); dt()

    def two_streams():
        cur = torch.cuda.current_stream()
        side.wait_stream(cur)
        di()
        with torch.cuda.stream(side):
            dt()
        cur.wait_stream(side)

    for name, fn, flops in (("dI = P @ B", di, gf), ("dT = P^T @ A", dt, gf), ("both, one stream", both, 2 * gf),
                            ("both, two streams", two_streams, 2 * gf)):
        ms = graph_timed(fn, 7)
        print(f"block {rows}x{cols}: {name:<20} {ms:.4f} ms {flops / ms:.0f} TFLOP/s", flush=True)
