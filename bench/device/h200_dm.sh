# 1 x H200 (counts part), issue 11: the warp-specialised gradient block with an interior fast path (tiles inside
# the bounds and off the positives' diagonal skip the masks and selects: fewer instructions per element; h200_dl:
# a third consumer did not help, so the epilogue's issue rate, not its window, is what limits it). WS_MODE 0
# against 7 (no fast path), 32k / 65k.
source bench/device/env.sh
R=/tmp/dm; mkdir -p $R
for m in 0 7; do
  WS_MODE=$m timeout 90 python bench/diag_gluon_grad.py --sizes 32768,65536 --reps 7 > $R/ws_mode$m.log 2>&1
  echo "== mode $m"; grep "ms\|Error\|error\|diff" $R/ws_mode$m.log | grep -v "^    \|File" | head -16
done
pack
echo "elapsed $((SECONDS - T0)) s"
