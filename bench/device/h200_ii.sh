# 1 x H200 (counts part), issue 11: the Gluon CLIP gradient block runs 480 TFLOP/s-equivalent at 32k-65k (4,096 x 4,096,
# 8,192 x 4,096) but 455 / 444 at 131k / 262k's wider blocks (8,192 x 8,192, 16,384 x 8,192; h200_ig). Timed with the
# cast-sized blocks at 32k-262k, then Nsight Compute on the first launch at 32k and 131k side by side (L2 hit rates,
# traffic, stalls).
source bench/device/env.sh
R=/tmp/ii; mkdir -p $R
timeout $(left 120) python bench/diag_gluon_grad.py --cast --sizes 32768,65536,131072,262144 > $R/gluon_grad_cast_ii_h200.log 2>&1
cat $R/gluon_grad_cast_ii_h200.log
pack
NCU=$(which ncu 2>/dev/null || ls /usr/local/cuda*/bin/ncu 2>/dev/null | head -1)
for B in 32768 131072; do
  timeout $(left 400) $NCU --kernel-name regex:clip_grad_ws --launch-count 1 --clock-control none \
      --section SpeedOfLight --section MemoryWorkloadAnalysis --section WarpStateStats --section SchedulerStats \
      --metrics lts__t_sector_hit_rate.pct,lts__t_sectors_srcunit_tex_op_read.sum,lts__t_sectors_srcunit_tex_op_write.sum,dram__bytes_read.sum,dram__bytes_write.sum,sm__pipe_tensor_op_hmma_cycles_active.avg.pct_of_peak_sustained_elapsed,sm__cycles_elapsed.avg.per_second,gpu__time_duration.sum,lts__t_sectors_op_read.sum,lts__t_sectors_op_write.sum \
      python bench/diag_gluon_grad.py --cast --sizes $B --reps 1 > $R/ncu_gluon_grad_${B}_ii_h200.log 2>&1
  grep -v "^==PROF==" $R/ncu_gluon_grad_${B}_ii_h200.log | grep -E "^ +[a-zA-Z]" | grep -vE "^ +(OPT|INF|WRN)|^          " | tail -75
  pack
done
echo "elapsed $((SECONDS - T0)) s"
