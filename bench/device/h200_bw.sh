# 1 x H200 (counts part), issue 11: the loss op with its CUDA-graph replay (copies by one
# multi-tensor launch per dtype): the GPU tests of the replay and of the op, where the host time of
# a graphed call goes (cProfile at B = 1,024), the op against the compiled dense losses on an idle
# GPU (1k-16k, eager rows and graph_max_batch 16,384 beside) and behind 20 ms of queued work (1k-8k).
source bench/device/env.sh
R=/tmp/bw; mkdir -p $R
timeout $(left 150) python -m pytest -m gpu -q tests/ops/test_graphs_gpu.py > $R/gpu_tests_graphs.log 2>&1
tail -3 $R/gpu_tests_graphs.log
pack
timeout $(left 230) python bench/bench_contrastive_loss.py --sizes 1024,2048,4096,8192,16384 --big "" --reps 9 \
    --anchors compiled_dense,dense_siglip --eager --graph-max-batch 16384 --out $R/contrastive_loss_idle.jsonl \
    --host-profile 1024 > $R/contrastive_loss_idle.log 2>&1
grep "^|" $R/contrastive_loss_idle.log
pack
timeout $(left 330) python bench/bench_contrastive_loss.py --sizes 1024,2048,4096,8192 --big "" --reps 9 \
    --anchors compiled_dense,dense_siglip --eager --queued-ms 20 --out $R/contrastive_loss_q20.jsonl \
    > $R/contrastive_loss_q20.log 2>&1
grep "^|" $R/contrastive_loss_q20.log
pack
timeout $(left 520) python -m pytest -m gpu -q tests/ops/test_contrastive_loss_gpu.py > $R/gpu_tests_ops.log 2>&1
tail -2 $R/gpu_tests_ops.log
pack
echo "elapsed $((SECONDS - T0)) s"
