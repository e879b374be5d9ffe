# 1 x H100 (counts part), patch dropout's GPU test on flat parameters, the layout of every preset that uses
# "reduce-overhead" (h100_fz: with per-tensor parameters the test's loop failed with or without patch dropout and with
# or without a mask: "accessing tensor output of CUDAGraphs that has been overwritten", in the text tower's backward);
# control: flat parameters without patch dropout.
source bench/device/env.sh
R=/tmp/ga; mkdir -p $R
timeout 200 python -m pytest -m gpu -q -p no:warnings -p no:cacheprovider tests/pipeline/test_patch_dropout.py \
    > $R/gpu_tests_patch_dropout_h100.log 2>&1
tail -2 $R/gpu_tests_patch_dropout_h100.log
for m in 1; do pd=0.0  # m: flat parameters (per-tensor: h100_fz)
timeout 150 python - $pd $m > $R/control_flat$m.log 2>&1 <<'PY'
import sys, torch
sys.path.insert(0, "tests/pipeline")
from test_patch_dropout import _towers
model = _towers(float(sys.argv[1]), compile=True, compile_mode="reduce-overhead", flat_parameters=sys.argv[2] == "1").cuda().train()
g = torch.Generator(device="cuda").manual_seed(0)
pixels = torch.randn(6, 3, 30, 30, device="cuda", generator=g)
ids = torch.randint(3, 40, (6, 8), device="cuda", generator=g); ids[:, -1] = 1
mask = torch.ones_like(ids)
def step():
    img, txt, scale, _ = model(pixels, ids, mask)
    (scale * (img @ txt.T)).logsumexp(dim=1).sum().backward()
    return img.detach().clone()
try:
    feats = [step() for _ in range(4)]
    print(f"flat {sys.argv[2]}: loop ok; consecutive steps differ:", [bool((a - b).abs().max() > 1e-3) for a, b in zip(feats, feats[1:])])
except RuntimeError as exc:
    print(f"flat {sys.argv[2]}: loop failed:", str(exc).splitlines()[0][:160])
PY
tail -1 $R/control_flat$m.log
done
pack
