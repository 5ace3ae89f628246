# Round 27, device call 2 (carry [".whl", ".exp"]): A-B-A at 704 streams on one lease:
# new tree (prompts in NumPy, deferred full collections in server and load generator),
# main before (7a52978), new again. No probe (it perturbs the GIL-bound core).
source .exp/gpu.sh >/dev/null; LOG=$OUT/log.txt; T0=$SECONDS; mkdir -p /tmp/old
tar xzf .exp/r27old.tgz -C /tmp/old; ln -sfn $PWD/.exp /tmp/old/.exp; ln -sfn $PWD/.whl /tmp/old/.whl
python3 -m fishserve probe 2>&1 | tail -2 | tee -a $LOG
F="--max-decode-batch 16 --early-chunk-margin 0.12 --engine-sms 56 --boost-frames 64 --async-scheduling --first-chunk-deadline 0.15"
gcs() { echo "$1: $(grep -c 'garbage collection of generation 2' /tmp/serve_$1.log) gen-2 pauses logged; $(grep 'garbage collection' /tmp/serve_$1.log | tail -3 | cut -c1-160)" | tee -a $LOG; }
export PROCS=2 DUR=30 STOP_S=560
run_server A1 "$F" 704 2>&1 | tee -a $LOG; gcs A1
(NEW=$PWD; cd /tmp/old && export PYTHONPATH=/tmp/site:/tmp/old BENCH_DIR=$NEW && run_server B1 "$F" 704 2>&1 | tee -a $LOG); gcs B1
if (( SECONDS - T0 < 430 )); then run_server A2 "$F" 704 2>&1 | tee -a $LOG; gcs A2; fi
cd $OUT && tar czf res.tgz A1 B1 A2 2>/dev/null; rm -rf A1 B1 A2; echo "total $((SECONDS-T0)) s" | tee -a $LOG
