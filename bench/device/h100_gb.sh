# 1 x H100 (counts part), patch dropout's GPU test with each step as pipeline.step runs it: the loss on detached leaves,
# then a surrogate backward (h100_fx to h100_ga: the loss taken straight on the towers' outputs failed under
# "reduce-overhead" with or without patch dropout, mask or flat parameters: "accessing tensor output of CUDAGraphs that
# has been overwritten", in the text tower's backward).
source bench/device/env.sh
R=/tmp/gb; mkdir -p $R
timeout 200 python -m pytest -m gpu -q -p no:warnings -p no:cacheprovider tests/pipeline/test_patch_dropout.py \
    > $R/gpu_tests_patch_dropout_h100.log 2>&1
tail -2 $R/gpu_tests_patch_dropout_h100.log
pack
