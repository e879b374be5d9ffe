# 1 x H200 (counts part), issue 11: the Gluon CLIP gradient block with a deeper wgmma queue (two groups in flight, the
# ring's slot released two chunks later) and a path without selects for tiles with no positive and no bound
# (tmp_clip_store_variants.py, device-only), alone and followed by the op's two gradient GEMMs; the forward sums
# (which share the queue) too. h200_gm's profile: the k-loop and the epilogue take about equal samples.
source bench/device/env.sh
R=/tmp/gn; mkdir -p $R
timeout $(left 300) python bench/device/tmp_clip_store_variants.py > $R/gluon_clip_q2_fast_h200.log 2>&1
cat $R/gluon_clip_q2_fast_h200.log
pack
echo "elapsed $((SECONDS - T0)) s"
