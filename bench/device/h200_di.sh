# 1 x H200 (counts part), issue 11: the warp-specialised CLIP gradient block with the epilogue's row and column
# vectors loaded before each tile's MMA (h200_dh: 0.041 ms MMA-only against 0.056 with the epilogue at 4k);
# BLOCK_K 64 and 128. Mode 1 / 0 on a small block, then 32k / 65k against the op's kernel and cuBLAS.
source bench/device/env.sh
R=/tmp/di; mkdir -p $R
for m in 1 0; do
  WS_MODE=$m timeout 60 python bench/diag_gluon_grad.py --sizes 4096 --tiles 64,128,64,6 64,128,128,4 --reps 5 > $R/ws_mode$m.log 2>&1
  echo "== mode $m"; grep "ws\|Error\|error" $R/ws_mode$m.log | grep -v "^    \|File" | head -6
done
pack
timeout $(left 400) python bench/diag_gluon_grad.py --sizes 32768,65536 > $R/gluon_grad_h200.log 2>&1
grep -v "^    \|^  File" $R/gluon_grad_h200.log | tail -30
pack
echo "elapsed $((SECONDS - T0)) s"
