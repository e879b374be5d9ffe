# 1 x H200 (counts part), issue 11: bisecting h200_de's launch failure of the warp-specialised kernel:
# WS_MODE 2 (the loader and the ring's barriers only), 1 (with the consumers' wgmma), 0 (with the epilogue).
source bench/device/env.sh
R=/tmp/df; mkdir -p $R
for m in 2 1 0; do
  WS_MODE=$m CUDA_LAUNCH_BLOCKING=1 timeout 60 python bench/diag_gluon_grad.py --sizes 4096 --tiles 64,128,64,4 --reps 3 > $R/ws_mode$m.log 2>&1
  echo "== mode $m"; grep "ws\|Error\|error" $R/ws_mode$m.log | grep -v "^    \|File" | head -4
done
pack
echo "elapsed $((SECONDS - T0)) s"
