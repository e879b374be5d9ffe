# 1 x H200 (counts part), issue 11, after h200_jc: the CLIP plain kernel's d-scale terms summed a side at a time (no
# spill under Triton 3.6 or 3.9) and the forward sums' items without positives in whole tiles taking an epilogue
# without the select. The Gluon GPU tests; the sums alone by replay against every item with the select
# (tmp_plain_ab.py, device-only); the op queued 20 ms at 16k-262k against both earlier forms (variants, one process).
source bench/device/env.sh
R=/tmp/jd; mkdir -p $R
timeout $(left 230) python -m pytest -m gpu -q -p no:warnings -p no:cacheprovider tests/ops/test_gluon_gpu.py \
    > $R/gpu_tests_gluon_plain4_jd.log 2>&1
tail -3 $R/gpu_tests_gluon_plain4_jd.log
pack
timeout $(left 330) python bench/device/tmp_plain_ab.py sums --sizes 32768,65536,262144 --reps 5 \
    > $R/gluon_sums_plain_jd_h200.log 2>&1
grep -E "^#|TFLOP|difference" $R/gluon_sums_plain_jd_h200.log | cut -c1-160
pack
T="(64, 128, 64, 6)"
OLD="{'on': True, 'tiles': $T, 'launch': 'clip_grad_block_old'}"
OLDS="{'on': True, 'tiles': (64, 128, 64, 4, 32), 'launch': 'clip_sums_old'}"
timeout $(left 590) python bench/device/tmp_plain_ab.py bench --sizes 16384,32768,65536 --big "131072,262144" \
    --anchors compiled_dense,dense_siglip --queued-ms 20 --out $R/contrastive_loss_h200_plain3.jsonl \
    --variant "oldplain:_GLUON=$OLD" --variant "oldsums:_GLUON_SUMS=$OLDS" \
    > $R/contrastive_loss_h200_plain3_jd_queued20.log 2>&1
grep "^|" $R/contrastive_loss_h200_plain3_jd_queued20.log | cut -c1-200
tail -3 $R/contrastive_loss_h200_plain3_jd_queued20.log | cut -c1-300
pack
echo "elapsed $((SECONDS - T0)) s"
