# 1 x H200 (counts part), issue 11: the op's CLIP backward takes the warp-specialised Gluon gradient block
# (ops/gluon_kernels.py) on sm_90. Its GPU tests (against the Triton kernel over awkward shapes, flags, dtypes;
# the op's backward), the replay tests and the op's GPU tests; the block against the Triton kernel and cuBLAS
# (bench/diag_gluon_grad.py); the op with the Gluon block / with the Triton block (variant) / compiled dense,
# behind 20 ms of queued work, 8k-65k, one process.
source bench/device/env.sh
R=/tmp/dn; mkdir -p $R
timeout $(left 60) python bench/diag_gluon_grad.py --sizes 32768,65536 > $R/gluon_grad_ops_h200.log 2>&1
grep -v "^    \|^  File" $R/gluon_grad_ops_h200.log | tail -12
timeout $(left 150) python -m pytest -m gpu -q tests/ops/test_gluon_gpu.py tests/ops/test_graphs_gpu.py > $R/gpu_tests_gluon.log 2>&1
tail -3 $R/gpu_tests_gluon.log
pack
timeout $(left 330) python bench/bench_contrastive_loss.py --sizes 8192,16384,32768,65536 --big "" --reps 7 \
    --queued-ms 20 --anchors compiled_dense --variant "triton_grad:_GLUON={'on': False}" \
    --out $R/contrastive_loss_gluon_queued20.jsonl > $R/contrastive_loss_gluon_queued20.log 2>&1
grep "^|" $R/contrastive_loss_gluon_queued20.log | head -30
pack
timeout $(left 560) python -m pytest -m gpu -q tests/ops/test_contrastive_loss_gpu.py > $R/gpu_tests_ops.log 2>&1
tail -2 $R/gpu_tests_ops.log
pack
echo "elapsed $((SECONDS - T0)) s"
