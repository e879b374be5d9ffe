# 1 x H200 (counts part), issue 11: the Gluon sums kernel with chunks of 32 row tiles (h200_fv: 11.04 against 11.75 ms
# with 64 at 65k, 2.83 against 3.03 at 32k): chunks of 32 / 16 / 8, the op's GPU tests (all three files), the op with
# it against the Triton strips queued at 16k-65k.
source bench/device/env.sh
R=/tmp/fw; mkdir -p $R
timeout $(left 100) python bench/diag_gluon_sums.py --sizes 16384,32768,65536 \
    --tiles 64,128,64,4,32 64,128,64,4,16 64,128,64,4,8 > $R/gluon_sums_chunks_h200.log 2>&1
grep "ms" $R/gluon_sums_chunks_h200.log
pack
timeout $(left 380) python -m pytest -m gpu -q -p no:warnings tests/ops/test_gluon_gpu.py tests/ops/test_contrastive_loss_gpu.py \
    tests/ops/test_graphs_gpu.py > $R/gpu_tests_ops_gluon_sums.log 2>&1
tail -4 $R/gpu_tests_ops_gluon_sums.log
pack
timeout $(left 560) python bench/bench_contrastive_loss.py --sizes 16384,32768,65536 --big "" --reps 7 --anchors compiled_dense \
    --queued-ms 20 --variant "tstrips:_GLUON_SUMS={'on': False, 'tiles': (64, 128, 64, 4, 32)}" \
    --out $R/sums.jsonl > $R/contrastive_loss_h200_gluon_sums_chunk32_queued20.log 2>&1
grep -h "^| " $R/contrastive_loss_h200_gluon_sums_chunk32_queued20.log | grep -v siglip | tail -24
pack
echo "elapsed $((SECONDS - T0)) s"
