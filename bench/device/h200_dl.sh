# 1 x H200 (counts part), issue 11: the warp-specialised gradient block with three consumer warpgroups taking
# turns at the tensor cores (each epilogue gets two MMA phases to run in; h200_dk: with two, one phase was not
# enough), against two, on the 65k and 32k blocks; WS_MODE 1 (no epilogue) beside.
source bench/device/env.sh
R=/tmp/dl; mkdir -p $R
for m in 1 0; do
  WS_MODE=$m timeout 90 python bench/diag_gluon_grad.py --sizes 32768,65536 --reps 7 > $R/ws_mode$m.log 2>&1
  echo "== mode $m"; grep "ms\|Error\|error\|diff" $R/ws_mode$m.log | grep -v "^    \|File" | head -16
done
pack
echo "elapsed $((SECONDS - T0)) s"
