# 1 x H200 (counts part), issue 11: the op's strip kernel (masks at the edges and positives / on
# every tile / none) against bench/diag_stats_epilogue.py's unmasked copy, B = 16k-65k.
source bench/device/env.sh
R=/tmp/ck; mkdir -p $R
timeout $(left 200) python bench/diag_stats_epilogue.py --sizes 16384,65536 --no-modes \
    --strips 128,128,64,8,4,1,32,0 > $R/stats_strips_masks_h200.log 2>&1
grep "^B=\|^#\|Error" $R/stats_strips_masks_h200.log | head -40
pack
echo "elapsed $((SECONDS - T0)) s"
