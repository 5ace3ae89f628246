# Round 27, device call 3, same lease right after call 2: main before (B2, 704), then the
# new tree at 768 and 832 (A3).
source .exp/gpu.sh >/dev/null; LOG=$OUT/log.txt; T0=$SECONDS; mkdir -p /tmp/old
[[ -d /tmp/old/fishserve ]] || tar xzf .exp/r27old.tgz -C /tmp/old; ln -sfn $PWD/.exp /tmp/old/.exp
F="--max-decode-batch 16 --early-chunk-margin 0.12 --engine-sms 56 --boost-frames 64 --async-scheduling --first-chunk-deadline 0.15"
gcs() { echo "$1: $(grep -c 'garbage collection of generation 2' /tmp/serve_$1.log) gen-2 pauses logged" | tee -a $LOG; }
export PROCS=2 DUR=30 STOP_S=470
(NEW=$PWD; cd /tmp/old && export PYTHONPATH=/tmp/site:/tmp/old BENCH_DIR=$NEW && run_server B2 "$F" 704 2>&1 | tee -a $LOG); gcs B2
run_server A3 "$F" 768 832 2>&1 | tee -a $LOG; gcs A3
cd $OUT && tar czf res.tgz B2 A3 2>/dev/null; rm -rf B2 A3; echo "total $((SECONDS-T0)) s" | tee -a $LOG
