# 1 x H100 (counts part), issue 11: the SigLIP gradient block with its pair losses in the warp-specialised Gluon kernel
# (h200_gd) on an H100: the Gluon GPU tests, the op against the Triton SigLIP block as a variant, queued, at 4k-65k.
source bench/device/env.sh
R=/tmp/fq; mkdir -p $R
timeout $(left 220) python -m pytest -m gpu -q -p no:warnings tests/ops/test_gluon_gpu.py > $R/gpu_tests_gluon_h100.log 2>&1
tail -3 $R/gpu_tests_gluon_h100.log
pack
timeout $(left 540) python bench/bench_contrastive_loss.py --sizes 4096,16384,32768,65536 --big "" --reps 7 \
    --anchors compiled_dense,dense_siglip --queued-ms 20 --variant-siglip \
    --variant "tsig:_GLUON_SIGLIP={'on': False, 'tiles': (64, 128, 64, 6), 'launch': 'siglip_grad_block'}" \
    --out $R/siglip.jsonl > $R/contrastive_loss_h100_gluon_siglip_queued20.log 2>&1
grep -h "^| " $R/contrastive_loss_h100_gluon_siglip_queued20.log
pack
echo "elapsed $((SECONDS - T0)) s"
