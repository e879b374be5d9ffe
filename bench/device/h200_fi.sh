# 1 x H200 (counts part), issue 11: in the op every 64 x 256 Gluon block ran ~13% slower than the 64 x 128 one (h200_fh,
# uniform over the blocks), alone ~3% faster (graph replays): the two alone and between the op's two GEMMs, replayed
# from a CUDA graph or launched eagerly (bench/device/tmp_wide.py, tmp_wide_context.py, for this call only).
source bench/device/env.sh
R=/tmp/fi; mkdir -p $R
timeout 300 python bench/device/tmp_wide_context.py 2>&1 | grep -v "leaked\|nanobind\|^ - \|UserWarning\|warn_once" > $R/wide_context_h200.log
cat $R/wide_context_h200.log
pack
echo "elapsed $((SECONDS - T0)) s"
