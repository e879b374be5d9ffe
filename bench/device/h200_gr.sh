# 1 x H200 (counts part): the distributed sweeps' CLIP gradient blocks sum their share of d scale (col_ref,
# dscale_out), so the schemes' forwards take the plain sums by column strips (the Gluon kernel). The GPU tests of the
# kernels and the op, then one rank's compute per scheme emulated on one GPU (bench/diag_rank_compute.py) with and
# without it, against the 1-GPU op on the whole batch in the same process.
source bench/device/env.sh
R=/tmp/gr; mkdir -p $R
timeout $(left 240) python -m pytest -m gpu -q -p no:warnings tests/ops/test_gluon_gpu.py \
    tests/ops/test_contrastive_loss_gpu.py > $R/gpu_tests_gr.log 2>&1
tail -3 $R/gpu_tests_gr.log
pack
timeout $(left 520) python bench/diag_rank_compute.py --worlds 2 4 --batches 32768 65536 131072 \
    --loss clip siglip --out $R/rank_compute.jsonl > $R/rank_compute_gr_h200.log 2>&1
cat $R/rank_compute_gr_h200.log
pack
echo "elapsed $((SECONDS - T0)) s"
