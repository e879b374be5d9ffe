# 1 x H200 (counts part), issue 11: after the gradient kernels' shared memory moved into one helper (_grad_smem) and the
# op tests of the three Gluon kernels into one (_op_with_and_without): the Gluon GPU tests, and the blocks' times
# (bench/diag_gluon_grad.py --siglip; h200_gg: CLIP 0.055 / 0.104 ms, SigLIP 0.071 / 0.132 at 32k / 65k).
source bench/device/env.sh
R=/tmp/gh; mkdir -p $R
timeout $(left 90) python bench/diag_gluon_grad.py --siglip > $R/gluon_grad_siglip_gh_h200.log 2>&1
cat $R/gluon_grad_siglip_gh_h200.log
pack
timeout $(left 400) python -m pytest -m gpu -q -p no:warnings tests/ops/test_gluon_gpu.py > $R/gpu_tests_gluon_gh.log 2>&1
tail -3 $R/gpu_tests_gluon_gh.log
pack
echo "elapsed $((SECONDS - T0)) s"
