# 4 x H200, call A: issue 11 (the distributed loss over 4 GPUs, one node and 2 "nodes" x 2), issue 10
# (ViT-B/32 preset throughput on 1 GPU, then per GPU on 4), issue 14 (training-level exactness over
# 4 ranks at the stable lr). Everything goes back as one tar, rewritten after each phase.
source bench/device/env.sh
R=/tmp/a; mkdir -p $R
nvidia-smi topo -m > $R/topo.txt 2>&1
# the scenes for the exactness runs, on 16 cores of 64 while the loss benchmark runs
taskset -c 48-63 python launch/batch_study.py --prepare --out /tmp/unused > $R/prepare.log 2>&1 &
timeout 120 torchrun --nproc_per_node 4 bench/bench_distributed.py --batches 32768 65536 131072 262144 \
    --budget-s 100 --out $R/distributed.jsonl > $R/distributed.log 2>&1
timeout 55 torchrun --nproc_per_node 4 bench/bench_distributed.py --schemes hierarchical_ring --local-world-size 2 \
    --batches 65536 131072 --budget-s 40 --out $R/distributed.jsonl > $R/distributed_2x2.log 2>&1
pack; wait
timeout 100 python bench/bench_pipeline.py --only throughput --throughput_model vitb32 --micro_batch 1024 --zero 2 \
    --impls triton --anchors --out $R/pipeline.jsonl > $R/pipeline_w1.log 2>&1
timeout 110 deepspeed --num_gpus 4 bench/bench_pipeline.py --only throughput --throughput_model vitb32 --micro_batch 1024 \
    --zero 2 --impls triton --anchors --distributed gather --out $R/pipeline.jsonl > $R/pipeline_w4.log 2>&1
pack
timeout $(left 575) deepspeed --num_gpus 4 bench/bench_exactness.py --out $R/w4.json \
    --variants ring hierarchical_ring_2x2 disco hierarchical_ring gather > $R/w4.log 2>&1
pack
grep -h "^|" $R/distributed*.log | tail -20; tail -3 $R/pipeline_w*.log; echo "elapsed $((SECONDS - T0)) s"
