# 1 x H200 (counts part), issue 11: the warp-specialised CLIP gradient block with one shared ring (6-8 stages)
# and the consumers' MMA phases taking turns (h200_dg's separate rings of 2-3 stages starved the MMA: the loads
# alone took 0.050 ms of a block cuBLAS computes in 0.040). Modes 2 / 1 / 0 on a small block, then 32k / 65k.
source bench/device/env.sh
R=/tmp/dh; mkdir -p $R
for m in 2 1 0; do
  WS_MODE=$m CUDA_LAUNCH_BLOCKING=1 timeout 60 python bench/diag_gluon_grad.py --sizes 4096 --tiles 64,128,64,6 --reps 3 > $R/ws_mode$m.log 2>&1
  echo "== mode $m"; grep "ws\|Error\|error" $R/ws_mode$m.log | grep -v "^    \|File" | head -4
done
pack
timeout $(left 400) python bench/diag_gluon_grad.py --sizes 32768,65536 > $R/gluon_grad_h200.log 2>&1
grep -v "^    \|^  File" $R/gluon_grad_h200.log | tail -30
pack
echo "elapsed $((SECONDS - T0)) s"
