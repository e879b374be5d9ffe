# 1 x H200 (counts part), issue 11: CLIP at 32k is 11.3-11.5 ms, 1.30-1.32x the 8.7 ms roofline figure; the
# forward sums (~2.7 ms) are the part with knobs left. Their chunk of row tiles an item (32, chosen at 65k without the
# rotation) with the rotated order at 16k / 24k / 32k: 8 / 16 / 32 / 64, by replay.
source bench/device/env.sh
R=/tmp/id; mkdir -p $R
timeout $(left 300) python bench/diag_gluon_sums.py --sizes 16384,24576,32768 --reps 7 --rotate 1 \
    --tiles 64,128,64,4,8 64,128,64,4,16 64,128,64,4,32 64,128,64,4,64 > $R/gluon_sums_chunks_rotated_id_h200.log 2>&1
grep "TFLOP" $R/gluon_sums_chunks_rotated_id_h200.log
pack
echo "elapsed $((SECONDS - T0)) s"
