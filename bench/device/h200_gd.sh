# 1 x H200 (counts part), issue 11: the SigLIP gradient block with its pair losses (the forward of a loss whose backward
# follows) in the warp-specialised Gluon kernel, its atomics after G's store (h200_gc: 0.067 against 0.081 ms for the
# Triton kernel at 32k, 0.132 against 0.163 at 65k). The Gluon tests; the op against the Triton block as a variant,
# queued, at 4k-65k; the op's other GPU tests; SigLIP and CLIP against the dense losses on an idle GPU at 32k / 65k.
source bench/device/env.sh
R=/tmp/gd; mkdir -p $R
timeout $(left 100) python -m pytest -m gpu -q -p no:warnings tests/ops/test_gluon_gpu.py > $R/gpu_tests_gluon_siglip.log 2>&1
tail -3 $R/gpu_tests_gluon_siglip.log
pack
timeout $(left 260) python bench/bench_contrastive_loss.py --sizes 4096,16384,32768,65536 --big "" --reps 7 \
    --anchors compiled_dense,dense_siglip --queued-ms 20 --variant-siglip \
    --variant "tsig:_GLUON_SIGLIP={'on': False, 'tiles': (64, 128, 64, 6), 'launch': 'siglip_grad_block'}" \
    --out $R/siglip.jsonl > $R/contrastive_loss_h200_gluon_siglip_queued20.log 2>&1
grep -h "^| " $R/contrastive_loss_h200_gluon_siglip_queued20.log | grep siglip
pack
timeout $(left 410) python -m pytest -m gpu -q -p no:warnings tests/ops/test_contrastive_loss_gpu.py tests/ops/test_graphs_gpu.py \
    > $R/gpu_tests_ops_gluon_siglip.log 2>&1
tail -2 $R/gpu_tests_ops_gluon_siglip.log
pack
timeout $(left 595) python bench/bench_contrastive_loss.py --sizes 32768,65536 --big "" --reps 9 \
    --anchors compiled_dense,dense_siglip --interleave 40 --interleave-max 65536 --out $R/idle.jsonl \
    > $R/contrastive_loss_h200_gluon_siglip_idle_32k_65k.log 2>&1
grep "^# interleaved\|^| " $R/contrastive_loss_h200_gluon_siglip_idle_32k_65k.log | tail -16
pack
echo "elapsed $((SECONDS - T0)) s"
