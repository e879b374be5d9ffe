# 1 x H200 (counts part), issue 11: the warp-specialised gradient block with the MMA turn passed once the tile's
# MMAs are done (h200_dj: passed at issue, the epilogue of 64 x 128 tiles looked ~3 us long). WS_MODE 1 / 0 / 6
# on the 65k block, then 0 at 32k.
source bench/device/env.sh
R=/tmp/dk; mkdir -p $R
for m in 1 0 6; do
  WS_MODE=$m timeout 60 python bench/diag_gluon_grad.py --sizes 65536 --tiles 64,128,64,6 64,128,128,4 --reps 7 > $R/ws_mode$m.log 2>&1
  echo "== mode $m"; grep "ms\|Error\|error" $R/ws_mode$m.log | grep -v "^    \|File" | head -6
done
timeout 60 python bench/diag_gluon_grad.py --sizes 32768 --tiles 64,128,64,6 64,128,128,4 --reps 7 > $R/ws_32k.log 2>&1
grep "ms\|Error\|error\|diff" $R/ws_32k.log | grep -v "^    \|File" | head -8
pack
echo "elapsed $((SECONDS - T0)) s"
