# 1 x H200, call D: the GPU tests of the loss kernels (after the shared tile prologue), the one-GPU
# references of the exactness runs at lr 5e-4 (naive, triton, naive_seed1; the 4-rank runs were
# 4 x H200 call A), and the constant-lr control of the study at 16k and 64k (seed 0).
source bench/device/env.sh
R=/tmp/d; mkdir -p $R
python launch/batch_study.py --prepare --out /tmp/unused > $R/prepare.log 2>&1 &
PREP=$!
timeout 150 python -m pytest -q -m gpu tests/ops -x -p no:cacheprovider > $R/gpu_tests.log 2>&1
pack; wait $PREP
timeout $(left 330) python bench/bench_exactness.py --out $R/w1.json --variants naive triton naive_seed1 \
    > $R/w1.log 2>&1
pack
timeout $(left 540) python launch/batch_study.py --loader-workers 15 --lr-rule constant --batches 16384 65536 --seeds 0 \
    --out $R/study_constant --run-dir runs/constant > $R/constant.log 2>&1
pack
tail -2 $R/gpu_tests.log; grep -h "done:" $R/*.log; grep -h "batch_study: b" $R/constant.log | grep loss
echo "elapsed $((SECONDS - T0)) s"
