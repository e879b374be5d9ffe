# 1 x H200 (counts half): the GPU tests of ops with the final TMA tiles and floor, then ViT-B/32 at
# micro-batch 256: ZeRO-3 with layer stacks with and without pipeline.zero3_step's lighter step
# (--on_device_step 0 1), next to ZeRO-2 and the torch_compile anchor, same process.
source bench/device/env.sh
R=/tmp/ab; mkdir -p $R
timeout $(left 190) python -m pytest -m gpu -q -x tests/ops/test_contrastive_loss_gpu.py > $R/gpu_tests_ops_tma_final.log 2>&1
pack
timeout $(left 570) python bench/bench_pipeline.py --only throughput --throughput_model vitb32 --micro_batch 256 \
    --zero 3 2 --zero3_leaf stack --on_device_step 0 1 --flat_parameters 1 --impls triton \
    --anchors torch_compile --compile_mode reduce-overhead --overlap_comm 0 \
    --out $R/pipeline.jsonl > $R/pipeline_256_z3lighten.log 2>&1
pack
tail -2 $R/gpu_tests_ops_tma_final.log; grep -h "^throughput\|Error\|lightened" $R/pipeline_*.log | sort -u; echo "elapsed $((SECONDS - T0)) s"
