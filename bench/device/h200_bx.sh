# 1 x H200 (counts part), issue 11: the loss op's CUDA-graph replay, now only on an idle stream
# (ops/registered._graphed): its GPU tests, the op against the compiled dense losses on an idle GPU
# (1k-16k; eager rows and graph_max_batch 16,384 beside; the kernel table of a replayed call at
# 1,024) and behind 20 ms of queued work (1k-8k, where the op now runs eagerly), the op's GPU tests.
source bench/device/env.sh
R=/tmp/bx; mkdir -p $R
timeout $(left 150) python -m pytest -m gpu -q tests/ops/test_graphs_gpu.py > $R/gpu_tests_graphs.log 2>&1
tail -3 $R/gpu_tests_graphs.log
pack
timeout $(left 250) python bench/bench_contrastive_loss.py --sizes 1024,2048,4096,8192,16384 --big "" --reps 9 \
    --anchors compiled_dense,dense_siglip --eager --graph-max-batch 16384 --out $R/contrastive_loss_idle.jsonl \
    --profile 1024 --profile-out $R/contrastive_loss_profile_1k_graphs.txt > $R/contrastive_loss_idle.log 2>&1
grep "^|" $R/contrastive_loss_idle.log
pack
timeout $(left 340) python bench/bench_contrastive_loss.py --sizes 1024,2048,4096,8192 --big "" --reps 9 \
    --anchors compiled_dense,dense_siglip --eager --queued-ms 20 --out $R/contrastive_loss_q20.jsonl \
    > $R/contrastive_loss_q20.log 2>&1
grep "^|" $R/contrastive_loss_q20.log
pack
timeout $(left 520) python -m pytest -m gpu -q tests/ops/test_contrastive_loss_gpu.py > $R/gpu_tests_ops.log 2>&1
tail -2 $R/gpu_tests_ops.log
pack
echo "elapsed $((SECONDS - T0)) s"
