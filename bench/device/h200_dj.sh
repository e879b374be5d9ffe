# 1 x H200 (counts part), issue 11: where the warp-specialised gradient block's epilogue time goes (h200_di: the
# row/column vectors loaded before the MMA made it slower, reverted). WS_MODE 1 (no epilogue), 0 (full), 3 (no
# exponentials), 4 (no d-scale sums), 5 (no store), 6 (the raw tile stored), on the 65k block.
source bench/device/env.sh
R=/tmp/dj; mkdir -p $R
for m in 1 0 3 4 5 6; do
  WS_MODE=$m timeout 60 python bench/diag_gluon_grad.py --sizes 65536 --tiles 64,128,64,6 64,128,128,4 --reps 7 > $R/ws_mode$m.log 2>&1
  echo "== mode $m"; grep "ms\|Error\|error" $R/ws_mode$m.log | grep -v "^    \|File" | head -6
done
pack
echo "elapsed $((SECONDS - T0)) s"
