# 1 x H200 (counts half): where the fused loss kernels' epilogues spend their time
# (bench/proto_epilogue.py: the op's epilogue, one exponential per element, no column
# reductions, no exponentials, row sums only), statistics over the whole B x B and the
# gradient block of one backward band, at B = 16k and 65k, five tile configurations.
source bench/device/env.sh
R=/tmp/ad; mkdir -p $R
timeout $(left 500) python bench/proto_epilogue.py --sizes 16384,65536 --reps 7 > $R/proto_epilogue.log 2>&1
pack
cat $R/proto_epilogue.log | grep -v "^#"; echo "elapsed $((SECONDS - T0)) s"
