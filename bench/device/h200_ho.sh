# 1 x H200 (counts part), issue 11: why the op's CLIP time grows faster than B^2 past 65k (h200_hn: 43.4 / 191.2 /
# 819 ms at 65k / 131k / 262k; its profile at 131k: the forward sums 50.7 ms a call against 11.5 at 65k, 4.4x, the
# gradient blocks and GEMMs 4.07-4.08x). The Gluon sums alone by CUDA-graph replay (sustained: ten calls a replay) at
# 65k / 131k / 262k and 65k again after them, chunks of 32 (the op's) / 16 / 64 row tiles.
source bench/device/env.sh
R=/tmp/ho; mkdir -p $R
timeout $(left 500) python bench/diag_gluon_sums.py --sizes 65536,131072,262144,65536 --reps 3 \
    --tiles 64,128,64,4,32 64,128,64,4,16 64,128,64,4,64 > $R/gluon_sums_big_ho_h200.log 2>&1
cat $R/gluon_sums_big_ho_h200.log
pack
echo "elapsed $((SECONDS - T0)) s"
