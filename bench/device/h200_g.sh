# 1 x H200 (counts half): issue 11's fused GEMM kernels. The ops' GPU tests (bf16 included) on
# them, the tile sweep against cuBLAS (bench_loss_kernels.py), then the op against the
# compiled dense anchors at B = 1k-65k with the best tiles, beside the unfused path.
source bench/device/env.sh
R=/tmp/g; mkdir -p $R
timeout 200 python -m pytest -m gpu -q -x tests/ops -p no:cacheprovider > $R/gpu_tests.log 2>&1
tail -3 $R/gpu_tests.log
pack
timeout $(left 380) python bench/bench_loss_kernels.py --sizes 16384,65536 --best $R/tiles.json \
    --out $R/loss_kernels.jsonl > $R/loss_kernels.log 2>&1
grep "best\|cublas\|unfused" $R/loss_kernels.log
pack
[ -f $R/tiles.json ] && T="--tiles $R/tiles.json"
timeout $(left 570) python bench/bench_contrastive_loss.py $T --unfused --big "" \
    --anchors compiled_dense,dense_siglip --profile 1024,65536 --profile-out $R/profile.txt \
    --out $R/contrastive_loss.jsonl > $R/contrastive_loss.log 2>&1
pack
grep "^|" $R/contrastive_loss.log; echo "elapsed $((SECONDS - T0)) s"
