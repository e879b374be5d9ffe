# 1 x H200 (counts part), issue 11: more tiles for the strip statistics (the unmasked copy in
# bench/diag_stats_epilogue.py, beside the op's kernel), B = 32k / 65k.
source bench/device/env.sh
R=/tmp/cn; mkdir -p $R
timeout $(left 200) python bench/diag_stats_epilogue.py --sizes 32768,65536 --no-modes \
    --strips 128,128,64,8,4,1,32,0 128,128,64,8,3,1,32,0 128,128,64,8,5,1,32,0 128,128,64,8,4,1,64,0 \
    128,128,128,8,3,1,32,0 128,128,32,8,6,1,32,0 256,64,64,8,4,1,32,0 64,256,64,8,4,1,32,0 \
    128,192,64,8,3,1,32,0 > $R/stats_strips_tiles_h200.log 2>&1
grep "^B=\|^#\|Error" $R/stats_strips_tiles_h200.log | cut -c1-110 | head -40
pack
echo "elapsed $((SECONDS - T0)) s"
