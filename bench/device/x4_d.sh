# 4 x H200 (counts in full; not yet run: the 4-GPU kind was not lent in the twelfth to eighteenth sessions): every 4-GPU bar still open,
# with the code as it stands (Gluon gradient blocks and sums, the SigLIP one-sweep path; since the twelfth session the
# schemes' CLIP forwards on the column-strip sums, d scale summed in their gradient blocks), one call, ~9 minutes.
# Issue 11: the NCCL tests, then CLIP and SigLIP per scheme against the 1-GPU op on the whole batch behind 20 ms of
# queued work (bars: ring and hierarchical ring >= 90% at B >= 65,536 and >= 75% at 32,768, disco >= 95% at
# B >= 65,536; disco pipelined against its one step, disco_one_step), and 2 "nodes" x 2 against one node of 4. Issue 10: the ViT-B/32 preset (micro-batch 1,024, ZeRO-2,
# its `gather` loss) on one GPU and per GPU on 4 (bar: >= 90%). Needs .whl and .tex carried (deepspeed and friends, FusedAdam).
source bench/device/env.sh
R=/tmp/x4d; mkdir -p $R
nvidia-smi topo -m > $R/topo.txt 2>&1
timeout 90 python -m pytest -m multigpu -q -x tests/ops/test_distributed_nccl.py > $R/gpu_tests_nccl_x4.log 2>&1
tail -2 $R/gpu_tests_nccl_x4.log
timeout 150 torchrun --nproc_per_node 4 bench/bench_distributed.py --queued-ms 20 \
    --batches 32768 65536 131072 262144 --schemes disco disco_one_step ring hierarchical_ring --budget-s 120 \
    --out $R/distributed.jsonl > $R/distributed_clip_x4.log 2>&1
pack
timeout 70 torchrun --nproc_per_node 4 bench/bench_distributed.py --queued-ms 20 --local-world-size 2 \
    --batches 65536 131072 --schemes hierarchical_ring --budget-s 50 \
    --out $R/distributed.jsonl > $R/distributed_clip_2x2_x4.log 2>&1
timeout 110 torchrun --nproc_per_node 4 bench/bench_distributed.py --loss siglip --queued-ms 20 \
    --batches 32768 65536 131072 --schemes disco disco_one_step ring hierarchical_ring --budget-s 90 \
    --out $R/distributed.jsonl > $R/distributed_siglip_x4.log 2>&1
pack
CUDA_VISIBLE_DEVICES=0 timeout $(left 520) python bench/bench_pipeline.py --only throughput --throughput_model vitb32 \
    --micro_batch 1024 --zero 2 --impls triton --anchors --out $R/pipeline.jsonl > $R/pipeline_w1.log 2>&1
timeout $(left 590) deepspeed --num_gpus 4 bench/bench_pipeline.py --only throughput --throughput_model vitb32 \
    --micro_batch 1024 --zero 2 --impls triton --anchors --distributed gather --out $R/pipeline.jsonl > $R/pipeline_w4.log 2>&1
pack
grep -h -A 8 "^scheme" $R/distributed_*.log; grep -h "samples/s" $R/pipeline_w*.log | tail -6; echo "elapsed $((SECONDS - T0)) s"
