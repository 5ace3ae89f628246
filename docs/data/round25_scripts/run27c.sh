# Round 25, call 3: HEAD vs 0bf2852 without the server: host CPU per step on this machine's CPU
# (tiny model, model math stubbed) and the full-size engine alone under churn on the GPU.
mkdir -p /tmp/site /tmp/old; LOG=$OUT/log.txt; T0=$SECONDS
python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .whl/*.whl >/dev/null 2>&1
tar xzf .exp/old.tgz -C /tmp/old
python3 -c "import numpy, sys, torch; print('numpy', numpy.__version__, sys.version.split()[0], torch.__version__)" | tee -a $LOG
nproc | tee -a $LOG; lscpu | grep -E "Model name|MHz" | head -3 | tee -a $LOG
for i in 1 2; do for t in new old; do P=$PWD; [[ $t == old ]] && P=/tmp/old
  PYTHONPATH=/tmp/site:$P CUDA_VISIBLE_DEVICES= timeout 60 python3 .exp/hp_async.py 512 async 64 2>&1 | tail -1 | sed "s/^/$t hp /" | tee -a $LOG
done; done
echo "cpu done at $((SECONDS-T0)) s" | tee -a $LOG
for t in new old new old; do
  (( SECONDS - T0 > 400 )) && { echo "skip $t" | tee -a $LOG; continue; }
  P=$PWD; [[ $t == old ]] && P=/tmp/old
  PYTHONPATH=/tmp/site:$P timeout 130 python3 .exp/churn.py $t 560 12 2>&1 | grep -E "N=|Error|error" | tail -3 | tee -a $LOG
  echo "  at $((SECONDS-T0)) s" | tee -a $LOG
done
