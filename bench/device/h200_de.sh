# 1 x H200 (counts part), issue 11: h200_dd's warp-specialised kernel failed at launch ("unspecified launch
# failure"); variants each in a process of its own, launches blocking: register budgets (loader 40 / 88), a small
# block, one stage ring size.
source bench/device/env.sh
R=/tmp/de; mkdir -p $R
for v in "4096 64,128,64,4,232,40" "4096 64,128,64,4,208,88" "32768 64,128,64,4,208,88" "32768 64,128,64,2,208,88"; do
  set -- $v
  CUDA_LAUNCH_BLOCKING=1 timeout 60 python bench/diag_gluon_grad.py --sizes $1 --tiles $2 --reps 3 > $R/ws_$1_$2.log 2>&1
  echo "== $1 $2"; grep "ws\|Error\|error" $R/ws_$1_$2.log | grep -v "^    \|File" | head -6
done
pack
echo "elapsed $((SECONDS - T0)) s"
