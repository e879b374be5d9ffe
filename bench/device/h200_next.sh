# 1 x H200 (not yet run; a one-GPU machine counts half): issue 10's open bar with the new lever,
# ViT-B/32 at micro-batch 256 with and without model.flat_parameters (ZeRO-2), ZeRO-3, beside the
# torch_compile anchor in the same process; then seeds 1 and 2 of the study's constant-lr control.
source bench/device/env.sh
R=/tmp/n; mkdir -p $R
python launch/batch_study.py --prepare --out /tmp/unused > $R/prepare.log 2>&1 &
timeout 330 python bench/bench_pipeline.py --only throughput --throughput_model vitb32 --micro_batch 256 \
    --zero 2 3 --flat_parameters 0 1 --impls triton --anchors torch_compile --out $R/pipeline.jsonl > $R/pipeline_256.log 2>&1
wait
pack
timeout $(left 560) python launch/batch_study.py --loader-workers 15 --lr-rule constant --batches 16384 65536 --seeds 1 2 \
    --out $R/study_constant --run-dir runs/constant > $R/constant.log 2>&1
pack
grep -h "samples/s" $R/pipeline_256.log; grep -h "batch_study: b" $R/constant.log | grep loss; echo "elapsed $((SECONDS - T0)) s"
