# 1 x H200 (counts part): the vitl14 preset end to end (deepspeed --num_gpus 1 launch/pretrain.py
# --ds_config ds_configs/vitl14.json: ZeRO-3, per-GPU batch here 1,024 through the chunked backbone
# in chunks of 256, hierarchical_ring over one rank, bf16) from digits shards on disk, 8 steps,
# (A) with the preset as it was (per-block ZeRO-3 units, zero.Init, plain parameters, compile's
# default mode, overlap_comm on) and (B) with the fast settings of h200_bn (flat parameters, each
# tower one ZeRO-3 unit, towers built whole, overlap_comm off; CUDA graphs are refused with the chunked backbone). FusedAdam from .tex.
source bench/device/env.sh
R=/tmp/bo; mkdir -p $R
python launch/make_shards.py --digits --out runs/gpu_digits > $R/shards.log 2>&1; tail -2 $R/shards.log
COMMON=(--set data.train_shards='"runs/gpu_digits/train/shard-{000000..000005}.tar"' --set train_micro_batch_size_per_gpu=1024
        --set train.steps=8 --set train.log_every=1 --set train.save_every=1000 --set data.workers=8)
timeout $(left 290) deepspeed --num_gpus 1 launch/pretrain.py --ds_config ds_configs/vitl14.json "${COMMON[@]}" \
    --set train.output_dir='"runs/l14_a"' --set model.flat_parameters=false --set model.zero3_leaf_layers=true \
    --set model.zero3_init=true --set model.compile_mode='"default"' --set zero_optimization.overlap_comm=true \
    > $R/vitl14_preset_old.log 2>&1
grep -h "samples/s\|Error\|error:" $R/vitl14_preset_old.log | tail -9
pack
timeout $(left 580) deepspeed --num_gpus 1 launch/pretrain.py --ds_config ds_configs/vitl14.json "${COMMON[@]}" \
    --set train.output_dir='"runs/l14_b"' --set model.flat_parameters=true --set model.zero3_leaf_layers='"tower"' \
    --set model.zero3_init=false --set zero_optimization.overlap_comm=false \
    > $R/vitl14_preset_fast.log 2>&1
grep -h "samples/s\|Error\|error:" $R/vitl14_preset_fast.log | tail -9
pack
echo "elapsed $((SECONDS - T0)) s"
