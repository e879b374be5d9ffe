# 2 x H200: the scenes (64 px for the study model, 224 px for ViT-B/32), then in parallel
# GPU 1: the ViT-B/32 scenes preset on one GPU; GPU 0: a probe of the study (B = 1,024 and 65,536).
source bench/device/env.sh
nvidia-smi --query-gpu=name,memory.total --format=csv > $OUT/gpus.txt
( time python launch/make_shards.py --scenes 500000 --out data/scenes64 --scene-size 64 --samples-per-shard 10000 --workers 16 ) > $OUT/make64.log 2>&1 &
( time python launch/make_shards.py --scenes 100000 --out data/scenes --scene-size 224 --samples-per-shard 1000 --workers 16 ) > $OUT/make224.log 2>&1 &
wait
CUDA_VISIBLE_DEVICES=1 python launch/pretrain.py --ds_config ds_configs/scenes_vitb32.json > $OUT/vitb32_1gpu.log 2>&1 &
CUDA_VISIBLE_DEVICES=0 python launch/batch_study.py --batches 1024 65536 --seeds 0 --samples 2097152 --out $OUT/probe --run-dir runs/probe > $OUT/probe.log 2>&1
wait
mkdir -p $OUT/vitb32_1gpu && cp -r runs/scenes_vitb32/tb runs/scenes_vitb32/eval $OUT/vitb32_1gpu/ 2>/dev/null
cp -r runs/probe $OUT/probe_runs 2>/dev/null; find $OUT/probe_runs -name "*.pt" -delete 2>/dev/null
tail -5 $OUT/*.log
