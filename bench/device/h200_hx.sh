# 1 x H200 (counts part), issue 11: the Gluon forward sums now launch over row slabs of at most 2^33 logits
# (h200_hw: 584 against 438 TFLOP/s at 262k, 589 against 517 at 131k). The gluon GPU tests (the slabs and the rotated
# order against the Triton strips); where rotating the row tiles pays (h200_hu / hw: +5-10% at 32k, 0 at 65k, -18%
# at 131k): 16k-65k; the slab size at 98k-262k; the op behind 20 ms queued with the default and rotated at 16k-65k.
source bench/device/env.sh
R=/tmp/hx; mkdir -p $R
timeout $(left 120) python -m pytest -q -x -p no:cacheprovider tests/ops/test_gluon_gpu.py > $R/gpu_tests_gluon_hx.log 2>&1
tail -5 $R/gpu_tests_gluon_hx.log
timeout $(left 220) python bench/diag_gluon_sums.py --sizes 16384,24576,32768,49152,65536 --reps 7 --rotate 0 1 \
    > $R/gluon_sums_rotate_hx_h200.log 2>&1
grep "TFLOP" $R/gluon_sums_rotate_hx_h200.log
pack
timeout $(left 330) python bench/diag_gluon_sums.py --sizes 98304,131072,196608,262144 --reps 3 \
    --launch-logits 0 4294967296 8589934592 > $R/gluon_sums_slabs_hx_h200.log 2>&1
grep "TFLOP" $R/gluon_sums_slabs_hx_h200.log
pack
S='_GLUON_SUMS={"on":True,"tiles":(64,128,64,4,32),"launch":"clip_sums","kw":'
timeout $(left 540) python bench/bench_contrastive_loss.py --sizes 16384,32768,65536 --big 131072,262144 \
    --anchors compiled_dense --queued-ms 20 --out $R/contrastive_loss_h200_sums_slabs.jsonl \
    --variant "rotated:${S}{\"rotate\":True}}" > $R/contrastive_loss_h200_sums_slabs_queued20.log 2>&1
tail -28 $R/contrastive_loss_h200_sums_slabs_queued20.log
pack
echo "elapsed $((SECONDS - T0)) s"
