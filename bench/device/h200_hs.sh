# 1 x H200 (counts part), issue 11: why the Gluon forward sums fall from ~605 TFLOP/s at 65k-131k to 460-504 at
# 262k at full clock (h200_ho / h200_hq). Nsight Compute on the kernel's first launch at 65k and 262k, the clocks
# left to the GPU (--clock-control none): throughput, L2 / DRAM traffic and hit rates, warp stalls, side by side.
source bench/device/env.sh
R=/tmp/hs; mkdir -p $R
NCU=$(which ncu 2>/dev/null || ls /usr/local/cuda*/bin/ncu 2>/dev/null | head -1)
for B in 65536 262144; do
  timeout $(left 500) $NCU --kernel-name regex:clip_sums_ws --launch-count 1 --clock-control none \
      --section SpeedOfLight --section MemoryWorkloadAnalysis --section MemoryWorkloadAnalysis_Chart \
      --section WarpStateStats --section SchedulerStats --section LaunchStats \
      --metrics lts__t_sector_hit_rate.pct,lts__t_sectors_srcunit_tex_op_read.sum,lts__t_sectors_srcunit_tex_op_atom.sum,lts__t_sectors_srcunit_tex_op_red.sum,dram__bytes_read.sum,dram__bytes_write.sum,sm__cycles_elapsed.avg.per_second,gpu__time_duration.sum \
      python bench/diag_gluon_sums.py --sizes $B --reps 1 > $R/ncu_gluon_sums_${B}_hs_h200.log 2>&1
  grep -v "^==PROF==" $R/ncu_gluon_sums_${B}_hs_h200.log | tail -120
  pack
done
echo "elapsed $((SECONDS - T0)) s"
