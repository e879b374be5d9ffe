# 1 x H200 (counts part): how much of the CLIP strip statistics is the second exponential
# (bench/diag_one_exp.py: the op's strip kernel against copies computing the column term from
# the row exponential, and two bounds).
source bench/device/env.sh
R=/tmp/du; mkdir -p $R
nvidia-smi --query-gpu=name,clocks.max.sm --format=csv > $R/gpu.txt
timeout $(left 280) python bench/diag_one_exp.py --sizes 32768,65536 --scales 14.3,100 > $R/one_exp_h200.log 2>&1
cat $R/one_exp_h200.log | tail -30
pack
