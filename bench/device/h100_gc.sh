# 1 x H100 (counts part), patch dropout's GPU tests: the compiled towers (inductor's random numbers) and drop_patches in a
# graph replayed under "reduce-overhead" (h100_fx to h100_gb: the towers' own loop under "reduce-overhead" outside
# DeepSpeed failed with or without patch dropout: "accessing tensor output of CUDAGraphs that has been overwritten").
source bench/device/env.sh
R=/tmp/gc; mkdir -p $R
timeout 200 python -m pytest -m gpu -q -p no:warnings -p no:cacheprovider tests/pipeline/test_patch_dropout.py \
    > $R/gpu_tests_patch_dropout_h100.log 2>&1
tail -2 $R/gpu_tests_patch_dropout_h100.log
pack
