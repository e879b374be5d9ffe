# 2 x H200 (counts in full), lent again at this session's end: the NCCL tests with the current kernels inside the
# distributed schemes (the Gluon forward sums and SigLIP gradient block landed after x2_j), then CLIP and SigLIP per
# scheme against the 1-GPU op on the whole batch, behind 20 ms of queued work (x2_j.sh again).
source bench/device/env.sh
R=/tmp/x2k; mkdir -p $R
timeout $(left 150) python -m pytest -m multigpu -q -x tests/ops/test_distributed_nccl.py > $R/gpu_tests_nccl_x2k.log 2>&1
tail -2 $R/gpu_tests_nccl_x2k.log
pack
timeout $(left 250) torchrun --nproc_per_node 2 bench/bench_distributed.py --queued-ms 20 \
    --batches 32768 65536 131072 --schemes disco ring hierarchical_ring --budget-s 80 \
    --out $R/distributed.jsonl > $R/distributed_clip_x2k.log 2>&1
grep -A 8 "^scheme" $R/distributed_clip_x2k.log
pack
timeout $(left 350) torchrun --nproc_per_node 2 bench/bench_distributed.py --loss siglip --queued-ms 20 \
    --batches 32768 65536 131072 --schemes disco ring hierarchical_ring --budget-s 80 \
    --out $R/distributed.jsonl > $R/distributed_siglip_x2k.log 2>&1
grep -A 8 "^scheme" $R/distributed_siglip_x2k.log
pack
echo "elapsed $((SECONDS - T0)) s"
