# 2 x H200 (counts in full): the NCCL test (with its bf16 cases: d scale summed in the sweeps' gradient blocks, the
# forwards on the column-strip sums), then CLIP and SigLIP per scheme against the 1-GPU op on the whole batch, behind
# 20 ms of queued work (x2_k.sh again, the code of the twelfth session), disco pipelined (the default since the
# thirteenth session) against its one step (disco_one_step) in the same run.
source bench/device/env.sh
R=/tmp/x2l; mkdir -p $R
timeout $(left 150) python -m pytest -m multigpu -q -x tests/ops/test_distributed_nccl.py > $R/gpu_tests_nccl_x2l.log 2>&1
tail -2 $R/gpu_tests_nccl_x2l.log
pack
timeout $(left 250) torchrun --nproc_per_node 2 bench/bench_distributed.py --queued-ms 20 \
    --batches 32768 65536 131072 --schemes disco disco_one_step ring hierarchical_ring --budget-s 80 \
    --out $R/distributed.jsonl > $R/distributed_clip_x2l.log 2>&1
grep -A 8 "^scheme" $R/distributed_clip_x2l.log
pack
timeout $(left 350) torchrun --nproc_per_node 2 bench/bench_distributed.py --loss siglip --queued-ms 20 \
    --batches 32768 65536 131072 --schemes disco disco_one_step ring hierarchical_ring --budget-s 80 \
    --out $R/distributed.jsonl > $R/distributed_siglip_x2l.log 2>&1
grep -A 8 "^scheme" $R/distributed_siglip_x2l.log
pack
echo "elapsed $((SECONDS - T0)) s"
