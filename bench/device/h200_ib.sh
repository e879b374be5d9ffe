# 1 x H200 (counts part), issue 11: the Gluon gradient blocks take their tiles GROUP_M = 8 row tiles at a time
# (_tile_origin; never varied): 132 programs at work share ~16 A tiles and ~8 B tiles. The CLIP and SigLIP blocks at
# 32k / 65k by replay with GROUP_M 4 / 8 / 16 / 32, each value in its own process (the constexpr edited in this
# call's copy of ops/gluon_kernels.py only).
source bench/device/env.sh
R=/tmp/ib; mkdir -p $R
for G in 8 4 16 32; do
  sed -i "s/_GROUP_M = gl.constexpr([0-9]*)/_GROUP_M = gl.constexpr($G)/" ops/gluon_kernels.py
  grep -n "_GROUP_M = " ops/gluon_kernels.py
  timeout $(left 400) python bench/diag_gluon_grad.py --sizes 32768,65536 --reps 7 --siglip \
      > $R/gluon_grad_group_m${G}_ib_h200.log 2>&1
  grep -i "ms" $R/gluon_grad_group_m${G}_ib_h200.log | sed "s/^/G=$G /"
done
pack
echo "elapsed $((SECONDS - T0)) s"
