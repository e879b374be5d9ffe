# 1 x H200 (counts part): the new GPU test of the sweeps' summed d scale against the weighted sums (rank 0 through the
# emulated sweep, the Gluon kernels, b = 12,288), then one rank's compute again with the emulation's reduce-scatter now
# summing the N slices (disco's column partials mix as the ring's merges do; it took rank 0's slice before).
source bench/device/env.sh
R=/tmp/gx; mkdir -p $R
timeout $(left 150) python -m pytest -m gpu -q -p no:warnings tests/ops/test_sweep_dscale.py > $R/gpu_tests_sweep_dscale_gx.log 2>&1
tail -3 $R/gpu_tests_sweep_dscale_gx.log
pack
timeout $(left 480) python bench/diag_rank_compute.py --worlds 2 4 --batches 32768 65536 131072 \
    --loss clip siglip --out $R/rank_compute.jsonl > $R/rank_compute_gx_h200.log 2>&1
cat $R/rank_compute_gx_h200.log
pack
echo "elapsed $((SECONDS - T0)) s"
