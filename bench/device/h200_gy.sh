# 1 x H200 (counts part): disco pipelined (a step per column block, each block's partials reduced to its owner while the
# next is computed, sweeps.DISCO_PIPELINED): one rank's compute against the first version's one step on all B columns
# (one_step) and the ring, emulated; then the GPU test of the summed d scale through the pipelined emulation.
source bench/device/env.sh
R=/tmp/gy; mkdir -p $R
timeout $(left 330) python bench/diag_rank_compute.py --worlds 2 4 --batches 32768 65536 131072 --loss clip siglip \
    --schemes disco ring --variants default one_step local_blocks --out $R/rank_compute.jsonl > $R/rank_compute_gy_h200.log 2>&1
cat $R/rank_compute_gy_h200.log
pack
timeout $(left 560) python -m pytest -m gpu -q -p no:warnings tests/ops/test_sweep_dscale.py > $R/gpu_tests_sweep_dscale_gy.log 2>&1
tail -3 $R/gpu_tests_sweep_dscale_gy.log
pack
echo "elapsed $((SECONDS - T0)) s"
