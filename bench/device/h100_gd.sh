# 1 x H100 (counts part), why the CUDA-graph loop of test_patch_dropout failed (h100_fx to h100_gc: "accessing tensor
# output of CUDAGraphs that has been overwritten" in backward, also without patch dropout): the logging levels and
# TORCH_* variables, and the minimal loop outside pytest with torch's loggers at their defaults / at DEBUG.
source bench/device/env.sh
R=/tmp/gd; mkdir -p $R
env | grep -E "^TORCH|^PYTORCH" > $R/env.log
for lvl in default debug; do
timeout 120 python - $lvl > $R/minimal_$lvl.log 2>&1 <<'PY'
import logging, sys, torch
if sys.argv[1] == "debug":
    logging.basicConfig(level=logging.DEBUG)
print("torch.autograd.graph effective level", logging.getLogger("torch.autograd.graph").getEffectiveLevel())
sys.path.insert(0, "pipeline")
from patch_dropout import drop_patches
torch.manual_seed(0)
layer = torch.nn.Linear(16, 4).cuda()
fn = torch.compile(lambda t: layer(drop_patches(t, 12)).sum(dim=1), mode="reduce-overhead")
tokens = torch.randn(6, 26, 16, device="cuda")
def step():
    torch.compiler.cudagraph_mark_step_begin()
    out = fn(tokens)
    out.sum().backward()
    return out.detach().clone()
try:
    outs = [step() for _ in range(5)]
    print(sys.argv[1], "ok; consecutive steps differ:", [bool((a - b).abs().max() > 1e-4) for a, b in zip(outs, outs[1:])])
except RuntimeError as exc:
    print(sys.argv[1], "failed:", str(exc).splitlines()[0][:120])
PY
grep -v "^DEBUG\|^INFO" $R/minimal_$lvl.log | tail -2
done
cat $R/env.log
pack
