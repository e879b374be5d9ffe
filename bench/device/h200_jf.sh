# 1 x H200 (counts part), the twenty-fifth session: the towers replayed as CUDA graphs ("reduce-overhead") with
# gradients accumulated over micro-steps (tests/pipeline/test_cuda_graphs.py: DeepSpeed ZeRO-0/1/2, plain and flat
# blocks, 2 micro-steps a step, against the towers compiled without CUDA graphs) and patch dropout's CUDA-graph tests,
# with pipeline.model.copy_gradients_out_of_graphs; then the same tests with it switched off (the control: torch's
# CUDA-graph trees keep the first backward's gradients in their pool, pytorch/pytorch#169545).
source bench/device/env.sh
R=/tmp/jf; mkdir -p $R
nvidia-smi --query-gpu=name,memory.total --format=csv,noheader > $R/gpu.txt
T="tests/pipeline/test_cuda_graphs.py tests/pipeline/test_patch_dropout.py"
timeout $(left 175) python -m pytest -m gpu -q -p no:warnings -p no:cacheprovider $T --durations=5 \
    > $R/gpu_tests_cuda_graphs_jf.log 2>&1
tail -12 $R/gpu_tests_cuda_graphs_jf.log
pack
timeout $(left 250) python - $T > $R/gpu_tests_cuda_graphs_control_jf.log 2>&1 <<'PY'
import sys, pytest
import infclip.pipeline.model as model
model.copy_gradients_out_of_graphs = lambda params: None  # the control: gradients left in the graphs' pool
sys.exit(pytest.main(["-m", "gpu", "-q", "-p", "no:warnings", "-p", "no:cacheprovider", "-rf", *sys.argv[1:]]))
PY
grep -E "^FAILED|passed|failed" $R/gpu_tests_cuda_graphs_control_jf.log | cut -c1-200 | tail -14
grep -m2 -o "RuntimeError: Error: accessing tensor output of CUDAGraphs[^.]*" $R/gpu_tests_cuda_graphs_control_jf.log
pack
echo "elapsed $((SECONDS - T0)) s"
