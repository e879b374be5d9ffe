# 1 x H100 (counts part), the twenty-third session: launch/pretrain.py now leaves through pipeline.dist.exit_process
# (os._exit after destroying the groups and running the atexit handlers). The vitb32_zero3 preset on one GPU (NCCL)
# from rendered-scene shards: once under the deepspeed launcher (checkpoint mid-run, the HF export at the end), once as
# plain python; each one's exit code, the seconds from its last log line to its exit, what it wrote.
source bench/device/env.sh
R=/tmp/fv; mkdir -p $R
nproc > $R/cores.txt
timeout $(left 120) python launch/make_shards.py --scenes 8000 --out /tmp/sc --scene-size 256 --samples-per-shard 1000 \
    --eval-samples 100 --retrieval-samples 100 --workers 16 > $R/make_shards.log 2>&1
SH=$(python -c "import glob, json; print(json.dumps(sorted(glob.glob('/tmp/sc/train/*.tar')), separators=(',', ':')))")
COMMON="--ds_config ds_configs/vitb32_zero3.json --set data.train_shards=$SH --set data.workers=12 --set train.log_every=5"
run_one() {  # NAME LEFT CMD...: runs CMD, writes NAME.log and a line with the exit code and the seconds after the last line
  local name=$1 lim=$2; shift 2
  timeout $(left $lim) "$@" > $R/$name.log 2>&1; local rc=$?
  local gap=$(python -c "import os, time; print(round(time.time() - os.path.getmtime('$R/$name.log'), 1))")
  echo "$name rc $rc; its log last written $gap s before it exited" | tee -a $R/summary.txt
  grep -E "finished at step|error|Error|terminate" $R/$name.log | tail -3 | tee -a $R/summary.txt
}
run_one launcher 380 deepspeed --num_gpus 1 launch/pretrain.py $COMMON --set train.steps=30 --set train.save_every=15 \
    --set train.export_final=true --set train.output_dir=/tmp/run_l
ls /tmp/run_l /tmp/run_l/ckpt /tmp/run_l/final > $R/run_l_files.txt 2>&1; cat /tmp/run_l/ckpt/latest >> $R/run_l_files.txt
pack /tmp/run_l
run_one plain 580 python launch/pretrain.py $COMMON --set train.steps=20 --set train.save_every=0 --set train.output_dir=/tmp/run_p
pack /tmp/run_p
cat $R/run_l_files.txt | tr '\n' ' '; echo
echo "elapsed $((SECONDS - T0)) s"
