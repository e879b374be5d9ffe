# 1 x H200 (counts part), issue 11: the SigLIP gradient block (in the forward of a loss whose backward follows: with its
# pair losses) in a warp-specialised Gluon kernel (gluon_kernels.siglip_grad_block, taken by _gluon_grad with
# _GLUON_SIGLIP): the Gluon GPU tests, the op against the Triton SigLIP block as a variant queued at 4k-65k, the op's
# other GPU tests.
source bench/device/env.sh
R=/tmp/fz; mkdir -p $R
timeout $(left 160) python -m pytest -m gpu -q -p no:warnings tests/ops/test_gluon_gpu.py > $R/gpu_tests_gluon_siglip.log 2>&1
tail -15 $R/gpu_tests_gluon_siglip.log
pack
timeout $(left 380) python bench/bench_contrastive_loss.py --sizes 4096,16384,32768,65536 --big "" --reps 7 \
    --anchors compiled_dense,dense_siglip --queued-ms 20 --variant-siglip \
    --variant "tsig:_GLUON_SIGLIP={'on': False, 'tiles': (64, 128, 64, 6), 'launch': 'siglip_grad_block'}" \
    --out $R/siglip.jsonl > $R/contrastive_loss_h200_gluon_siglip_queued20.log 2>&1
grep -h "^| " $R/contrastive_loss_h200_gluon_siglip_queued20.log | tail -30
pack
timeout $(left 590) python -m pytest -m gpu -q -p no:warnings tests/ops/test_contrastive_loss_gpu.py tests/ops/test_graphs_gpu.py \
    > $R/gpu_tests_ops_gluon_siglip.log 2>&1
tail -4 $R/gpu_tests_ops_gluon_siglip.log
pack
echo "elapsed $((SECONDS - T0)) s"
