# 1 x H200 (counts half): statistics kernel variants (bench/proto_epilogue.py): the op's epilogue
# (mode 0), no column reductions (2), both quantities in one tl.reduce per direction (5), over
# nine tile shapes; and the column strips as one flattened loop (_stats_flat_strips).
source bench/device/env.sh
R=/tmp/af; mkdir -p $R
timeout $(left 450) python bench/proto_epilogue.py --sizes 16384,65536 --reps 7 --modes 0,2,5 --no_grad > $R/proto_reduce.log 2>&1
pack
cat $R/proto_reduce.log | grep -v "^#"; echo "elapsed $((SECONDS - T0)) s"
