# 1 x H200 (counts part): one rank's compute per scheme with the code as landed (d scale summed in the sweeps' gradient
# blocks, their blocks by the global batch's budget, rows added straight into the sum; h200_gt ran with a two-stream
# prototype since dropped), three variants, 32k-131k, CLIP and SigLIP; and the NCCL worker on one rank (world 1: the
# script itself, its bf16 strips cases included; the two-rank test needs 2 GPUs).
source bench/device/env.sh
R=/tmp/gu; mkdir -p $R
timeout $(left 120) torchrun --nproc_per_node 1 tests/ops/_nccl_worker.py > $R/nccl_worker_world1_gu.log 2>&1
tail -3 $R/nccl_worker_world1_gu.log
pack
timeout $(left 500) python bench/diag_rank_compute.py --worlds 2 4 --batches 32768 65536 131072 \
    --loss clip siglip --out $R/rank_compute.jsonl > $R/rank_compute_gu_h200.log 2>&1
cat $R/rank_compute_gu_h200.log
pack
echo "elapsed $((SECONDS - T0)) s"
