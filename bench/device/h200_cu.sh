# 1 x H200 (counts part), issue 11: two programs an SM so one program's epilogue can run beside the other's MMA:
# the gradient kernel with 4 warps (128 x 128 in 4 slices, BLOCK_K 64 / 32; 64 x 128 in 2 slices) and the
# strip statistics with 64 x 128 tiles and 4 warps, against the op's tiles, B = 16k-65k, one process.
source bench/device/env.sh
R=/tmp/cu; mkdir -p $R
timeout $(left 400) python bench/diag_strips.py --sizes 65536,32768,16384 --no-modes \
    --grad 128,128,64,8,4,3,2,4 128,128,32,8,4,4,2,4 64,128,64,8,4,4,2,2 \
    --strips 64,128,64,4,4,2,32 64,128,64,4,3,2,32 64,128,32,4,4,2,32 128,128,64,8,4,1,32 \
    > $R/two_programs_tiles_h200.log 2>&1
grep "^B=\|^#\|Error" $R/two_programs_tiles_h200.log | cut -c1-170 | head -60
pack
echo "elapsed $((SECONDS - T0)) s"
