# 1 x H200 (counts part): health check of the code as it stands after the thirteenth session (disco pipelined,
# sink.into): every GPU-marked test (the op against torch over the shape grids, the Gluon kernels, the CUDA-graph
# replays, the summed d scale through the sweeps, the patch GEMM against cuDNN) and the CUDA-only ZeRO-3 stream test.
mkdir -p .tex/tex
source bench/device/env.sh
R=/tmp/ha; mkdir -p $R
nvidia-smi --query-gpu=name,memory.total --format=csv,noheader > $R/gpu.txt
timeout $(left 540) python -m pytest -m gpu -q -p no:warnings tests/ops tests/pipeline/test_patch_embed.py \
    --durations=8 > $R/gpu_tests_all_ha_h200.log 2>&1
tail -14 $R/gpu_tests_all_ha_h200.log
pack
timeout $(left 580) python -m pytest -q -p no:warnings tests/pipeline/test_zero3_step.py -k cuda_current_stream \
    > $R/gpu_tests_zero3_stream_ha_h200.log 2>&1
tail -2 $R/gpu_tests_zero3_stream_ha_h200.log
pack
echo "elapsed $((SECONDS - T0)) s"
