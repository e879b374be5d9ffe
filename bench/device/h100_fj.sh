# 1 x H100 (counts part): the op on an H100 80GB (every figure so far is an H200's): its GPU tests, then the loss table
# behind 20 ms of queued work at 1k-65k against the compiled dense losses, one process.
source bench/device/env.sh
R=/tmp/fj; mkdir -p $R
nvidia-smi --query-gpu=name,power.limit,clocks.max.sm,memory.total --format=csv > $R/gpu_h100.txt
timeout $(left 330) python -m pytest -m gpu -q -p no:cacheprovider tests/ops/test_gluon_gpu.py tests/ops/test_contrastive_loss_gpu.py \
    tests/ops/test_graphs_gpu.py > $R/gpu_tests_ops_h100.log 2>&1
tail -3 $R/gpu_tests_ops_h100.log
pack
timeout $(left 580) python bench/bench_contrastive_loss.py --sizes 1024,2048,4096,8192,16384,32768,65536 --big "" \
    --reps 7 --anchors compiled_dense,dense_siglip --queued-ms 20 --out $R/contrastive_loss_queued.jsonl \
    > $R/contrastive_loss_h100_queued20.log 2>&1
grep "^|\|^# NVIDIA" $R/contrastive_loss_h100_queued20.log
pack
echo "elapsed $((SECONDS - T0)) s"
