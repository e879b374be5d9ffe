# 1 x H200 (counts part), issue 11 (CLIP at 1.34-1.42x its roofline at 32k / 65k): the Gluon gradient kernel with
# 64 x 256 tiles a consumer (bench/diag_gluon_wide.py: one m64n256 wgmma a chunk, the epilogue on halves or quarters
# of the accumulator) against the op's 64 x 128 kernel and cuBLAS on the backward's first block; P checked bit for bit.
source bench/device/env.sh
R=/tmp/eq; mkdir -p $R
timeout $(left 400) python bench/diag_gluon_wide.py --sizes 32768,65536 --reps 9 \
    --tiles 64,128,64,6,128 64,256,64,4,64 64,256,32,6,64 64,256,64,3,128 64,256,32,6,128 > $R/gluon_wide_h200.log 2>&1
cat $R/gluon_wide_h200.log | grep -v "leaked\|nanobind\|^ - "
pack
echo "elapsed $((SECONDS - T0)) s"
