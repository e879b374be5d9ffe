# 1 x H200 (counts part), issue 11: inside the op the 64 x 256 Gluon block took 0.060 ms at 32k against 0.054 for the
# 64 x 128 one (h200_ev), where alone it took 0.053 against 0.054: is it its shared memory (224 KB against 176 KB;
# cuBLAS's kernels run between the blocks)? The same A/B with 64 x 256 tiles in 184 KB (3 stages of K 64, or 6 of K 32).
source bench/device/env.sh
R=/tmp/ew; mkdir -p $R
for a in 64,256,64,3,64 64,256,32,6,64; do
  timeout $(left 300) python bench/diag_tiles_ab.py --sizes 16384,32768,65536 --rounds 20 --profile 2 --tiles $a 64,128,64,6,128 \
      2>&1 | grep -v "leaked\|nanobind\|^ - \|UserWarning\|_warn_once" | grep -v "spin_kernel\|nvjet" >> $R/tiles_ab_smem_h200.log
done
cat $R/tiles_ab_smem_h200.log
pack
echo "elapsed $((SECONDS - T0)) s"
