# 1 x H200 (counts part): the loss op's CUDA-graph tests after graph_max_batch became opt-in
# (default 0).
source bench/device/env.sh
R=/tmp/ca; mkdir -p $R
timeout $(left 200) python -m pytest -m gpu -q tests/ops/test_graphs_gpu.py > $R/gpu_tests_graphs.log 2>&1
tail -3 $R/gpu_tests_graphs.log
pack
echo "elapsed $((SECONDS - T0)) s"
