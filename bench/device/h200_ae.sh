# 1 x H200 (counts half): the statistics kernel walking column strips (bench/proto_epilogue.py
# _stats_strips: the column direction summed element-wise across a walk down a strip, reduced
# once per item) against the op's epilogue (mode 0) and its no-column-reduction floor (mode 2).
source bench/device/env.sh
R=/tmp/ae; mkdir -p $R
timeout $(left 400) python bench/proto_epilogue.py --sizes 16384,65536,4096 --reps 7 --configs 2 --modes 0,2 --no_grad > $R/proto_strips.log 2>&1
pack
cat $R/proto_strips.log | grep -v "^#"; echo "elapsed $((SECONDS - T0)) s"
