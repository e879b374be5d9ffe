# 1 x H200 (counts part), issue 11: graph_max_batch on by default (16,384): the op's GPU tests (they now
# replay on an idle stream wherever they do not say otherwise), then the op at its defaults against the
# compiled dense losses on an idle GPU, 1k-32k, with the eager op (graph_max_batch 0) beside.
source bench/device/env.sh
R=/tmp/ea; mkdir -p $R
timeout $(left 330) python -m pytest -m gpu -q tests/ops/test_graphs_gpu.py tests/ops/test_gluon_gpu.py \
    tests/ops/test_contrastive_loss_gpu.py > $R/gpu_tests_ops_graph_default.log 2>&1
tail -3 $R/gpu_tests_ops_graph_default.log
pack
timeout $(left 580) python bench/bench_contrastive_loss.py --sizes 1024,2048,4096,8192,16384,32768 --big "" --reps 9 \
    --anchors compiled_dense,dense_siglip --eager --out $R/contrastive_loss_idle.jsonl \
    > $R/contrastive_loss_h200_graph_default_idle.log 2>&1
grep "^|" $R/contrastive_loss_h200_graph_default_idle.log
pack
echo "elapsed $((SECONDS - T0)) s"
