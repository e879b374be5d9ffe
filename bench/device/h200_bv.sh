# 1 x H200 (counts part), issue 11: the loss op's CUDA-graph replay at small B (ops/graphs.py):
# its GPU tests, then diag_loss_graph.py (eager / in-op graphs / whole-call floor, idle GPU, 1k-16k),
# then bench_contrastive_loss.py on an idle GPU 1k-16k with the eager rows beside (held memory
# reported), and the GPU tests of the op as a whole.
source bench/device/env.sh
R=/tmp/bv; mkdir -p $R
timeout $(left 120) python -m pytest -m gpu -q -x tests/ops/test_graphs_gpu.py > $R/gpu_tests_graphs.log 2>&1
tail -15 $R/gpu_tests_graphs.log
pack
timeout $(left 220) python bench/diag_loss_graph.py --sizes 1024,2048,4096,8192,16384 > $R/loss_graph_h200.log 2>&1
grep "^|\|^#" $R/loss_graph_h200.log
pack
timeout $(left 400) python bench/bench_contrastive_loss.py --sizes 1024,2048,4096,8192,16384 --big "" --reps 7 \
    --anchors compiled_dense,dense_siglip --eager --graph-max-batch 16384 --out $R/contrastive_loss_idle.jsonl \
    > $R/contrastive_loss_idle.log 2>&1
grep "^|" $R/contrastive_loss_idle.log
pack
timeout $(left 560) python -m pytest -m gpu -q tests/ops/test_contrastive_loss_gpu.py > $R/gpu_tests_ops.log 2>&1
tail -2 $R/gpu_tests_ops.log
pack
echo "elapsed $((SECONDS - T0)) s"
