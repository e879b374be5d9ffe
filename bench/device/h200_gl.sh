# 1 x H200 (counts part), issue 11: what P's store costs the Gluon CLIP gradient block (tmp_clip_store_variants.py,
# device-only), alone and followed by the op's two gradient GEMMs; the profiler's warp stall reasons if ncu is here.
source bench/device/env.sh
R=/tmp/gl; mkdir -p $R
python -c "import triton, torch; print('triton', triton.__version__, 'torch', torch.__version__)"
which ncu nsys 2>&1 | head; ls /usr/local/cuda*/bin 2>/dev/null | grep -i "ncu\|nsys" | head
timeout $(left 240) python bench/device/tmp_clip_store_variants.py > $R/gluon_clip_store_variants_h200.log 2>&1
cat $R/gluon_clip_store_variants_h200.log
pack
NCU=$(which ncu 2>/dev/null || ls /usr/local/cuda*/bin/ncu 2>/dev/null | head -1)
if [ -n "$NCU" ]; then
  timeout $(left 520) $NCU --kernel-name regex:clip_grad_ws --launch-skip 1 --launch-count 1 \
      --section WarpStateStats --section SchedulerStats --section SpeedOfLight --section MemoryWorkloadAnalysis \
      --section ComputeWorkloadAnalysis python bench/device/tmp_one_block.py > $R/ncu_clip_grad_h200.log 2>&1
  tail -150 $R/ncu_clip_grad_h200.log
fi
pack
echo "elapsed $((SECONDS - T0)) s"
