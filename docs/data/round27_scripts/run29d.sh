# Round 27, device call 4, same lease: the new tree at 896, 960, 1024 (A4), then main before at 832 (B3)
#
source .exp/gpu.sh >/dev/null; LOG=$OUT/log.txt; T0=$SECONDS; mkdir -p /tmp/old
[[ -d /tmp/old/fishserve ]] || tar xzf .exp/r27old.tgz -C /tmp/old; ln -sfn $PWD/.exp /tmp/old/.exp
F="--max-decode-batch 16 --early-chunk-margin 0.12 --engine-sms 56 --boost-frames 64 --async-scheduling --first-chunk-deadline 0.15"
gcs() { echo "$1: $(grep -c 'garbage collection of generation 2' /tmp/serve_$1.log) gen-2 pauses logged" | tee -a $LOG; }
export PROCS=2 DUR=30 STOP_S=420
run_server A4 "$F" 896 960 1024 2>&1 | tee -a $LOG; gcs A4
if (( SECONDS - T0 < 330 )); then (NEW=$PWD; cd /tmp/old && export PYTHONPATH=/tmp/site:/tmp/old BENCH_DIR=$NEW && run_server B3 "$F" 832 2>&1 | tee -a $LOG); gcs B3; fi
cd $OUT && tar czf res.tgz A4 B3 2>/dev/null; rm -rf A4 B3; echo "total $((SECONDS-T0)) s" | tee -a $LOG
