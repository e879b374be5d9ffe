# 1 x H200 (counts part), issue 11: h200_df hung in WS_MODE 2 (a consumer waited on a slot several fills ahead:
# a barrier's parity tells only its next phase apart); now each consumer has its own ring. Modes 2, 1, 0 on a
# small block (launches blocking), then the kernel against the op's and cuBLAS at 32k / 65k.
source bench/device/env.sh
R=/tmp/dg; mkdir -p $R
for m in 2 1 0; do
  WS_MODE=$m CUDA_LAUNCH_BLOCKING=1 timeout 60 python bench/diag_gluon_grad.py --sizes 4096 --tiles 64,128,64,2 --reps 3 > $R/ws_mode$m.log 2>&1
  echo "== mode $m"; grep "ws\|Error\|error" $R/ws_mode$m.log | grep -v "^    \|File" | head -4
done
pack
timeout $(left 420) python bench/diag_gluon_grad.py --sizes 32768,65536 > $R/gluon_grad_h200.log 2>&1
grep -v "^    \|^  File" $R/gluon_grad_h200.log | tail -30
pack
echo "elapsed $((SECONDS - T0)) s"
