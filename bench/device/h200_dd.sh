# 1 x H200 (counts part), issue 11: bench/diag_gluon_grad.py after h200_dc's compile error (constexprs passed
# through warp_specialize arrive as tensors: the tile sizes now come from the descriptors), GPU time by CUDA-graph
# replays; the warp-specialised CLIP gradient block against the op's kernel and cuBLAS at 32k / 65k.
source bench/device/env.sh
R=/tmp/dd; mkdir -p $R
timeout $(left 400) python bench/diag_gluon_grad.py --sizes 32768,65536 > $R/gluon_grad_h200.log 2>&1
grep -v "^    \|^  File" $R/gluon_grad_h200.log | tail -40
pack
echo "elapsed $((SECONDS - T0)) s"
