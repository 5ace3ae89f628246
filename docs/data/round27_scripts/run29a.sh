# Round 27, device call 1 (carry [".whl", ".exp"]): GPU tests of round 26's post-run fixes
# (beside the server's start-up), then the server at 704 streams with the stack/GIL/GC probe.
source .exp/gpu.sh >/dev/null; LOG=$OUT/log.txt; T0=$SECONDS
python3 -V | tee -a $LOG
python3 -m fishserve probe 2>&1 | tail -4 | tee -a $LOG
cp .exp/sitecustomize.py /tmp/site/sitecustomize.py
( timeout 260 python3 -m pytest -p no:cacheprovider --junitxml=$OUT/t.xml -k "cuda or gpu or graph or triton or prefilter or static_rows or warm or probe" \
  tests/engine tests/bench/test_device_probe.py > /tmp/tests.txt 2>&1; grep -E "passed|failed|Error" /tmp/tests.txt | tail -3 > /tmp/tests_sum.txt ) &
TP=$!
export PRE_LEVEL="while kill -0 $TP 2>/dev/null; do sleep 1; done; cat /tmp/tests_sum.txt | tee -a $LOG; echo tests done at \$((SECONDS-T0)) s | tee -a $LOG"
F="--max-decode-batch 16 --early-chunk-margin 0.12 --engine-sms 56 --boost-frames 64 --async-scheduling --first-chunk-deadline 0.15"
FS_PROBE=1 PROCS=2 DUR=30 run_server P1 "$F" 704 2>&1 | tee -a $LOG
python3 .exp/probe_summ.py /tmp/b/probe_P1_l704 /tmp/b/probe_pre_P1_l704 > $OUT/probe.txt 2>&1
for f in /tmp/b/probe_P1_l704/*.json; do python3 -c "
import json,sys; d=json.load(open('$f')); print('$f', ' '.join(d['argv'])[:60]); print(' gc', d['gc']); print(' census', d['census'])" >> $OUT/probe.txt; done
grep -E "garbage|WARNING" /tmp/serve_P1.log | tail -20 >> $LOG
cp /tmp/b/P1_l704/cpu.txt $OUT/ 2>/dev/null
cd $OUT && tar czf res.tgz P1 && rm -rf P1; echo "total $((SECONDS-T0)) s" | tee -a $LOG
