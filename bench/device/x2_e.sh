# 2 x H200 (counts in full): the distributed loss's size check on the host (a gloo twin of the
# NCCL group, ops/sweeps.py): the NCCL test (every scheme against one device, no host wait in a
# call, uneven batch = clear error), the waits and their price again, and the schemes' scaling.
source bench/device/env.sh
R=/tmp/x2e; mkdir -p $R
timeout $(left 200) python -m pytest -m multigpu -q tests/ops/test_distributed_nccl.py > $R/test_nccl.log 2>&1
tail -5 $R/test_nccl.log
timeout $(left 300) torchrun --nproc_per_node 2 bench/diag_ring_sync.py --batches 32768 65536 > $R/ring_sync_x2.log 2>&1
pack
timeout $(left 560) torchrun --nproc_per_node 2 bench/bench_distributed.py --batches 32768 65536 131072 \
    --schemes gather disco ring hierarchical_ring --out $R/distributed.jsonl > $R/distributed_x2.log 2>&1
pack
grep -v "^W1\|^\*\*\*\|UserWarning\|return func" $R/ring_sync_x2.log | tail -12
grep -A30 "^scheme" $R/distributed_x2.log | head -30; echo "elapsed $((SECONDS - T0)) s"
