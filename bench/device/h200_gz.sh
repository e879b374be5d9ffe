# 1 x H200 (counts part): the sweeps' gradient steps accumulating their rows' GEMMs straight into the rank's fp32 sum
# (sink.into: no band sums, no add a band) for disco pipelined and the ring; one rank's compute emulated against disco's
# one step, then the GPU test of the summed d scale (the sweeps' steps take the new path).
source bench/device/env.sh
R=/tmp/gz; mkdir -p $R
timeout $(left 300) python bench/diag_rank_compute.py --worlds 2 4 --batches 32768 65536 131072 --loss clip siglip \
    --schemes disco ring --variants default one_step --out $R/rank_compute.jsonl > $R/rank_compute_gz_h200.log 2>&1
cat $R/rank_compute_gz_h200.log
pack
timeout $(left 400) python -m pytest -m gpu -q -p no:warnings tests/ops/test_sweep_dscale.py > $R/gpu_tests_sweep_dscale_gz.log 2>&1
tail -3 $R/gpu_tests_sweep_dscale_gz.log
pack
echo "elapsed $((SECONDS - T0)) s"
