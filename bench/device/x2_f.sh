# 2 x H200 (counts in full): the NCCL test again (fixed harness), and the size check's price
# with 20 ms of GPU work queued before each call (as in training): the check on the host (gloo
# twin), the old check read from the GPU, no check.
source bench/device/env.sh
R=/tmp/x2f; mkdir -p $R
timeout $(left 200) python -m pytest -m multigpu -q tests/ops/test_distributed_nccl.py > $R/test_nccl.log 2>&1
tail -3 $R/test_nccl.log
timeout $(left 400) torchrun --nproc_per_node 2 bench/diag_ring_sync.py --batches 16384 32768 65536 > $R/ring_sync_x2.log 2>&1
pack
grep -v "^W1\|^\*\*\*\|UserWarning\|return func" $R/ring_sync_x2.log | tail -14; echo "elapsed $((SECONDS - T0)) s"
