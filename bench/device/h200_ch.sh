# 1 x H200 (counts part): the CLIP statistics by column strips (bench/diag_stats_epilogue.py
# --strips) against the op kernel, and the per-tile kernel without the weighted sums, B = 32k / 65k.
source bench/device/env.sh
R=/tmp/ch; mkdir -p $R
timeout $(left 400) python bench/diag_stats_epilogue.py --sizes 32768,65536 --tiles 128,128,64,8,8,4,1,1 \
    --strips 128,64,64,4,4,2,32,0 128,64,64,4,4,2,32,1 128,128,64,8,4,1,32,0 128,128,64,8,4,1,32,1 \
    128,128,64,8,3,1,16,0 128,256,64,8,3,1,32,0 128,128,64,8,4,2,32,0 \
    > $R/stats_strips_h200.log 2>&1
pack
grep "^B=\|^#\|Error" $R/stats_strips_h200.log | head -120; echo "elapsed $((SECONDS - T0)) s"
