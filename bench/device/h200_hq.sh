# 1 x H200 (counts part), issue 11: the Gluon forward sums at 262k run at 437-478 TFLOP/s with the SM clock at
# 1,935-1,965 MHz and ~650 W (not the power cap: cuBLAS's GEMM bursts at ~600 TFLOP/s and 1,425-1,500 MHz, 690 W;
# h200_hp), against 603 at 131k (h200_ho). Where the drop starts and whether the item's chunk of row tiles moves it:
# 196k and 262k, chunks of 32 / 64 / 128 / 256 row tiles, by replay.
source bench/device/env.sh
R=/tmp/hq; mkdir -p $R
timeout $(left 400) python bench/diag_gluon_sums.py --sizes 196608,262144 --reps 3 \
    --tiles 64,128,64,4,32 64,128,64,4,64 64,128,64,4,128 64,128,64,4,256 > $R/gluon_sums_chunks_hq_h200.log 2>&1
cat $R/gluon_sums_chunks_hq_h200.log
pack
echo "elapsed $((SECONDS - T0)) s"
