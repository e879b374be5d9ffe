# 1 x H200 (counts part): the GPU tests changed for graph_max_batch's new default (16,384).
source bench/device/env.sh
R=/tmp/eb; mkdir -p $R
timeout $(left 200) python -m pytest -m gpu -q tests/ops/test_graphs_gpu.py \
    "tests/ops/test_contrastive_loss_gpu.py::test_strip_statistics_match_the_tile_kernel" > $R/gpu_tests_graph_default_fixed.log 2>&1
tail -3 $R/gpu_tests_graph_default_fixed.log
pack
