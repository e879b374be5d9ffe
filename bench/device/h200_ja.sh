# 1 x H200 (counts part), issue 11: the Gluon plain CLIP gradient kernel in the op (blocks with no positive in whole
# 128 x 128 tiles; gluon_kernels.GRAD_PLAIN): the Gluon GPU tests, then the op queued 20 ms at 1k-262k against the
# op with it off (a variant, same process), the compiled dense anchor up to 65k.
source bench/device/env.sh
R=/tmp/ja; mkdir -p $R
timeout $(left 240) python -m pytest -m gpu -q -p no:warnings -p no:cacheprovider tests/ops/test_gluon_gpu.py \
    > $R/gpu_tests_gluon_plain_ja.log 2>&1
tail -3 $R/gpu_tests_gluon_plain_ja.log
pack
C1="{'on': True, 'tiles': (64, 128, 64, 6), 'launch': 'clip_grad_block', 'kw': {'plain': False}}"
timeout $(left 560) python bench/bench_contrastive_loss.py --big "131072,262144" --anchors compiled_dense \
    --queued-ms 20 --out $R/contrastive_loss_h200_plain_default.jsonl --variant "noplain:_GLUON=$C1" \
    > $R/contrastive_loss_h200_plain_default_ja_queued20.log 2>&1
grep "^|" $R/contrastive_loss_h200_plain_default_ja_queued20.log | cut -c1-220
tail -3 $R/contrastive_loss_h200_plain_default_ja_queued20.log | cut -c1-300
pack
echo "elapsed $((SECONDS - T0)) s"
