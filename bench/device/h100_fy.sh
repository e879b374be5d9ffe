# 1 x H100 (counts part), patch dropout's GPU test with cudagraph_mark_step_begin() before each step (h100_fw / h100_fx:
# the reduce-overhead case raised "accessing tensor output of CUDAGraphs that has been overwritten" in the text tower's
# backward), and, as a control, the same loop of the test without the mark and without patch dropout: does the
# failure depend on patch dropout?
source bench/device/env.sh
R=/tmp/fy; mkdir -p $R
timeout 200 python -m pytest -m gpu -q -p no:warnings -p no:cacheprovider tests/pipeline/test_patch_dropout.py \
    > $R/gpu_tests_patch_dropout_h100.log 2>&1
tail -2 $R/gpu_tests_patch_dropout_h100.log
for pd in 0.0 0.5; do
timeout 150 python - $pd > $R/control_unmarked_pd$pd.log 2>&1 <<'PY'
import sys, torch
sys.path.insert(0, "tests/pipeline")
from test_patch_dropout import _towers
model = _towers(float(sys.argv[1]), compile=True, compile_mode="reduce-overhead").cuda().train()
g = torch.Generator(device="cuda").manual_seed(0)
pixels = torch.randn(6, 3, 30, 30, device="cuda", generator=g)
ids = torch.randint(3, 40, (6, 8), device="cuda", generator=g); ids[:, -1] = 1
def step():
    img, txt, scale, _ = model(pixels, ids)
    (scale * (img @ txt.T)).logsumexp(dim=1).sum().backward()
    return img.detach().clone()
try:
    feats = [step() for _ in range(4)]
    print("unmarked loop ok; consecutive steps differ:", [bool((a - b).abs().max() > 1e-3) for a, b in zip(feats, feats[1:])])
except RuntimeError as exc:
    print("unmarked loop failed:", str(exc).splitlines()[0][:160])
PY
tail -1 $R/control_unmarked_pd$pd.log
done
pack
