# 1 x H100 (counts part), issue 11: the Gluon gradient blocks' PDL launches on an H100 80GB: the Gluon and CUDA-graph
# GPU tests, then the op queued 20 ms with PDL (the default) against without (a variant), CLIP and SigLIP, 16k-65k.
source bench/device/env.sh
R=/tmp/fs; mkdir -p $R
timeout $(left 300) python -m pytest -m gpu -q -p no:warnings -p no:cacheprovider tests/ops/test_gluon_gpu.py \
    tests/ops/test_graphs_gpu.py > $R/gpu_tests_gluon_graphs_fs_h100.log 2>&1
tail -3 $R/gpu_tests_gluon_graphs_fs_h100.log
pack
C0="{'on': True, 'tiles': (64, 128, 64, 6), 'launch': 'clip_grad_block', 'kw': {'pdl': False}}"
S0="{'on': True, 'tiles': (64, 128, 64, 6), 'launch': 'siglip_grad_block', 'kw': {'pdl': False}}"
timeout $(left 560) python bench/bench_contrastive_loss.py --sizes 16384,32768,65536 --big "" \
    --anchors compiled_dense --queued-ms 20 --out $R/contrastive_loss_h100_pdl.jsonl \
    --variant "nopdl:_GLUON=$C0;_GLUON_SIGLIP=$S0" --variant-siglip > $R/contrastive_loss_h100_pdl_queued20.log 2>&1
grep -E "TFLOP|^\|" $R/contrastive_loss_h100_pdl_queued20.log
pack
echo "elapsed $((SECONDS - T0)) s"
