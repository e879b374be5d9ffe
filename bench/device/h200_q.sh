# 1 x H200 (counts half): the loss op with its shorter host path (hand-written autograd kernel, the
# backward's scalar arithmetic inside the gradient kernels, per-shape launch settings cached): the
# GPU tests of ops first (the changed kernels compiled for real), then small B against compiled dense.
source bench/device/env.sh
R=/tmp/q; mkdir -p $R
timeout $(left 330) python -m pytest -m gpu -q -x tests/ops/test_contrastive_loss_gpu.py > $R/gpu_tests_ops.log 2>&1
pack
timeout $(left 590) python bench/bench_contrastive_loss.py --sizes 1024,2048,4096,8192,16384 --big "" \
    --anchors compiled_dense,dense_siglip --host-profile 1024 --out $R/contrastive_loss.jsonl > $R/contrastive_loss.log 2>&1
pack
tail -3 $R/gpu_tests_ops.log; grep "^|" $R/contrastive_loss.log; echo "elapsed $((SECONDS - T0)) s"
