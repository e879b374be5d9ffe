# 1 x H200 (counts part): the NCCL worker of tests/ops/test_distributed_nccl.py on one rank (world 1, NCCL) after its
# bf16 strips cases' fix (h200_gu: the text features took the wrong width); the two-rank test needs 2 GPUs.
source bench/device/env.sh
R=/tmp/gv; mkdir -p $R
timeout $(left 150) torchrun --nproc_per_node 1 tests/ops/_nccl_worker.py > $R/nccl_worker_world1_gv.log 2>&1
echo "rc $?"; grep -v Warning $R/nccl_worker_world1_gv.log | tail -5
pack
echo "elapsed $((SECONDS - T0)) s"
