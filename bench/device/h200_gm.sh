# 1 x H200 (counts part), issue 11: h200_gl again with the GEMMs fixed (what P's store costs the Gluon CLIP gradient
# block, tmp_clip_store_variants.py), and the profiler's stall reasons by instruction for the as-is block at 32k.
source bench/device/env.sh
R=/tmp/gm; mkdir -p $R
timeout $(left 200) python bench/device/tmp_clip_store_variants.py > $R/gluon_clip_store_variants_h200.log 2>&1
cat $R/gluon_clip_store_variants_h200.log
pack
timeout $(left 400) ncu --kernel-name regex:clip_grad_ws --launch-skip 1 --launch-count 1 \
    --metrics "regex:smsp__average_warps_issue_stalled_.*_per_issue_active\.ratio" \
    python bench/device/tmp_one_block.py > $R/ncu_stalls_h200.log 2>&1
grep -v "^==" $R/ncu_stalls_h200.log | awk '$NF+0 > 0.05' | tail -40
timeout $(left 520) ncu --kernel-name regex:clip_grad_ws --launch-skip 1 --launch-count 1 --section SourceCounters \
    --import-source yes --page source --print-source sass --csv python bench/device/tmp_one_block.py > $R/ncu_source_h200.csv 2>&1
wc -l $R/ncu_source_h200.csv; head -3 $R/ncu_source_h200.csv | cut -c1-600
pack
echo "elapsed $((SECONDS - T0)) s"
