# 1 x H200 (counts part), issue 11: the loss op's CUDA-graph replay on an idle stream, the backward
# of a replayed forward replaying too (ops/registered._graphed), the benchmark's held memory per row
# (graph cache cleared before each): its GPU tests, the op against the compiled dense losses on an idle GPU
# (1k-16k; eager rows and graph_max_batch 16,384 beside), the op's GPU tests.
source bench/device/env.sh
R=/tmp/by; mkdir -p $R
timeout $(left 150) python -m pytest -m gpu -q tests/ops/test_graphs_gpu.py > $R/gpu_tests_graphs.log 2>&1
tail -3 $R/gpu_tests_graphs.log
pack
timeout $(left 250) python bench/bench_contrastive_loss.py --sizes 1024,2048,4096,8192,16384 --big "" --reps 9 \
    --anchors compiled_dense,dense_siglip --eager --graph-max-batch 16384 --out $R/contrastive_loss_idle.jsonl \
    > $R/contrastive_loss_idle.log 2>&1
grep "^|" $R/contrastive_loss_idle.log
pack
timeout $(left 420) python -m pytest -m gpu -q tests/ops/test_contrastive_loss_gpu.py > $R/gpu_tests_ops.log 2>&1
tail -2 $R/gpu_tests_ops.log
pack
echo "elapsed $((SECONDS - T0)) s"
