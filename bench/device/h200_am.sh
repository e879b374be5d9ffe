# 1 x H200 (counts half): ViT-B/32 ZeRO-3 with layer stacks at micro-batch 256, the lighter step
# (pipeline.zero3_step, now also the autograd functions' identity binding and the engine's
# module walks) against DeepSpeed's own step, alternating in one process (1 0 1 0).
source bench/device/env.sh
R=/tmp/am; mkdir -p $R
python -c "import inspect, hashlib, torch; s = inspect.getsource(torch.autograd.Function.__dict__['apply'].__func__); print('torch', torch.__version__, 'Function.apply sha', hashlib.sha256(s.encode()).hexdigest()[:16])" > $R/apply_sha.txt 2>&1
timeout $(left 560) python bench/bench_pipeline.py --only throughput --throughput_model vitb32 --micro_batch 256 \
    --zero 3 --zero3_leaf stack --on_device_step 1 0 1 0 --flat_parameters 1 --impls triton --anchors \
    --compile_mode reduce-overhead --overlap_comm 0 --out $R/pipeline.jsonl > $R/pipeline_256_z3lighten2_alt.log 2>&1
pack
cat $R/apply_sha.txt; grep -h "^throughput\|Error\|lightened" $R/pipeline_*.log; echo "elapsed $((SECONDS - T0)) s"
