# 1 x H200 (counts part): the op's GPU tests (h200_gr ran out of time in them after the Gluon tests passed), then one
# rank's compute per scheme emulated on one GPU with three variants of the assembly: the default (d scale summed in
# the sweeps' gradient blocks, their blocks sized by the global batch's budget), local_blocks (sized by the column
# block's), weighted (the forward's weighted sums: the code before both), against the 1-GPU op in the same process.
source bench/device/env.sh
R=/tmp/gs; mkdir -p $R
timeout $(left 330) python -m pytest -m gpu -q -p no:warnings tests/ops/test_contrastive_loss_gpu.py \
    > $R/gpu_tests_gs.log 2>&1
tail -3 $R/gpu_tests_gs.log
pack
timeout $(left 560) python bench/diag_rank_compute.py --worlds 2 4 --batches 32768 65536 131072 \
    --loss clip siglip --out $R/rank_compute.jsonl > $R/rank_compute_gs_h200.log 2>&1
cat $R/rank_compute_gs_h200.log
pack
echo "elapsed $((SECONDS - T0)) s"
