# 1 x H100 (counts part), patch dropout's GPU test again (h100_fw: the reduce-overhead case failed on the test's own
# loop, which kept the last step's CUDA-graph outputs alive into the next call; each step is now a function, as in
# pipeline.step).
source bench/device/env.sh
R=/tmp/fx; mkdir -p $R
timeout 200 python -m pytest -m gpu -q -p no:warnings -p no:cacheprovider tests/pipeline/test_patch_dropout.py \
    > $R/gpu_tests_patch_dropout_h100.log 2>&1
tail -3 $R/gpu_tests_patch_dropout_h100.log
pack
