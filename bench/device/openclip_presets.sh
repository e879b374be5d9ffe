# 1 x H200: the vith14 and vitbigg14 presets' towers (OpenCLIP's ViT-H-14 and ViT-bigG-14 sizes) beside
# ViT-L/14's rows: samples/s, MFU and peak memory at micro-batch 256 (ZeRO-2 and ZeRO-3, the ViT-L/14 row's
# settings: flat per-block parameters, overlap_comm off, checkpointing "auto"), and the chunked backbone's
# per-GPU batches for ViT-H/14 (ZeRO-3, chunks of 256, as the preset; 65,536 as ViT-L/14's row: one step
# there takes ~4 minutes). One phase a call (each < 10 min; bigG's 80 blocks compile one graph each under
# ZeRO-3, so its ZeRO-2 row is a call of its own):
#   bash bench/device/openclip_presets.sh h14 | bigg14 | h14_batch | bigg14_z2   (carry .whl and .tex)
source bench/device/env.sh
R=/tmp/openclip_presets_$1; mkdir -p $R
common="--only throughput --micro_batch 256 --flat_parameters 1 --impls triton --anchors --compile_mode reduce-overhead
        --overlap_comm 0 --out $R/pipeline.jsonl"
case $1 in
  h14) timeout $(left 570) python bench/bench_pipeline.py $common --throughput_model vith14 --zero 2 3 \
           > $R/pipeline_vith14_256.log 2>&1 ;;
  bigg14) timeout $(left 570) python bench/bench_pipeline.py $common --throughput_model vitbigg14 --zero 3 \
              > $R/pipeline_vitbigg14_256.log 2>&1 ;;
  bigg14_z2) timeout $(left 570) python bench/bench_pipeline.py $common --throughput_model vitbigg14 --zero 2 \
                 > $R/pipeline_vitbigg14_256_z2.log 2>&1 ;;
  h14_batch) timeout $(left 570) python bench/bench_pipeline.py --only max_batch --max_batch_zero 3 --chunk 256 \
                 --max_batch_sizes vith14:16384,65536 --max_step_s 330 --out $R/pipeline.jsonl \
                 > $R/pipeline_vith14_max_batch.log 2>&1 ;;
esac
pack
grep -h "^throughput\|^max_batch\|Error\|error" $R/pipeline_*.log | sort -u; echo "elapsed $((SECONDS - T0)) s"
