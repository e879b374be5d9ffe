# 1 x H200 (counts part): why ZeRO-3 flat towers after a ZeRO-2 row ran at 0.59x with the compile caches reset
# (h200_hj) and at 0.93-0.95x without (h200_he): the same two rows with torch's cudagraph and perf-hint logs, once
# with the reset and once without; host time by phase.
# (--reset_compiled: a bench_pipeline.py option from h200_hi to h200_hk, removed after h200_hk: with the reset the
# second compiled model of a process stayed slow too, 0.43-0.59x)
source bench/device/env.sh
R=/tmp/hk; mkdir -p $R
for reset in 1 0; do
  TORCH_LOGS=perf_hints,cudagraphs timeout $(( $(left 560) / (reset + 1) )) python bench/bench_pipeline.py --only throughput \
      --throughput_model vitb32 --micro_batch 256 --zero 2 3 --zero3_leaf tower --flat_parameters tower --grad_ckpt off \
      --on_device_step 1 --anchors --reset_compiled $reset --host_phases 3 \
      --out $R/pipeline_vitb32_256_flat_towers_logs_reset$reset.jsonl > $R/pipeline_vitb32_256_flat_towers_logs_reset${reset}_h200.log 2>&1
  grep -E "^throughput|host ms" $R/pipeline_vitb32_256_flat_towers_logs_reset${reset}_h200.log | sort -u
  grep -i "skip\|rerecord\|re-record\|warmup" $R/pipeline_vitb32_256_flat_towers_logs_reset${reset}_h200.log | cut -c1-250 | sort | uniq -c | head -20
  pack
done
echo "elapsed $((SECONDS - T0)) s"
