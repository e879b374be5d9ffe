# 1 x H200 (counts part): the fused CLIP statistics kernel's epilogue taken apart
# (bench/diag_stats_epilogue.py), B = 16k-65k, one process, the op's tiles and larger ones.
source bench/device/env.sh
R=/tmp/bt; mkdir -p $R
timeout $(left 300) python bench/diag_stats_epilogue.py --sizes 32768,65536 --tiles 128,128,64,8,8,4,1,1 \
    128,128,64,8,8,3,1,1 128,256,64,8,8,3,1,1 256,128,64,8,8,3,1,1 64,256,64,8,4,3,1,1 128,128,64,8,4,4,1,1 \
    128,64,64,8,4,6,2,1 > $R/stats_epilogue_tiles_h200.log 2>&1
pack
grep "^B=\|^#\|Error" $R/stats_epilogue_tiles_h200.log | head -120; echo "elapsed $((SECONDS - T0)) s"
