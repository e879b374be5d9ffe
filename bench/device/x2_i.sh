# 2 x H200 (counts in full): distributed SigLIP takes its gradients in the forward (one sweep a call:
# the text features go round once). Each scheme against the 1-GPU op on the whole batch, behind 20 ms
# of queued work (training conditions), then CLIP in the same call for comparison; the NCCL tests.
source bench/device/env.sh
R=/tmp/x2i; mkdir -p $R
timeout $(left 200) torchrun --nproc_per_node 2 bench/bench_distributed.py --loss siglip --queued-ms 20 \
    --batches 32768 65536 131072 --schemes disco ring hierarchical_ring --budget-s 170 \
    --out $R/distributed.jsonl > $R/distributed_siglip_x2.log 2>&1
pack
timeout $(left 330) torchrun --nproc_per_node 2 bench/bench_distributed.py --queued-ms 20 \
    --batches 32768 65536 131072 --schemes disco ring hierarchical_ring --budget-s 120 \
    --out $R/distributed.jsonl > $R/distributed_clip_x2.log 2>&1
pack
timeout $(left 450) python -m pytest -m multigpu -q -x tests/ops/test_distributed_nccl.py > $R/gpu_tests_nccl.log 2>&1
pack
for f in distributed_siglip_x2 distributed_clip_x2; do grep -A 12 "^scheme" $R/$f.log; done
tail -2 $R/gpu_tests_nccl.log; echo "elapsed $((SECONDS - T0)) s"
