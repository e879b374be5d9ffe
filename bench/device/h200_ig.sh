# 1 x H200 (counts part), issue 11: CLIP at 32k spends 4.87 of 11.2 ms in the backward's 128 GEMMs (~675 TFLOP/s,
# outputs of 4,096 x 768: too few tiles for whole waves on 132 SMs). A block's two GEMMs on two streams against one,
# alone and after the Gluon block, at the op's block shapes (bench/diag_gemm_streams.py); cuBLAS and cuBLASLt.
source bench/device/env.sh
R=/tmp/ig; mkdir -p $R
for blas in cublas cublaslt; do
  timeout $(left 250) python bench/diag_gemm_streams.py --sizes 16384,32768,65536,131072,262144 --blas $blas \
      > $R/gemm_streams_${blas}_ig_h200.log 2>&1
  cat $R/gemm_streams_${blas}_ig_h200.log
  pack
done
echo "elapsed $((SECONDS - T0)) s"
