# Round 27, device call 5, same lease: the new tree again at 832 and 864 (A5)
#
source .exp/gpu.sh >/dev/null; LOG=$OUT/log.txt; T0=$SECONDS; mkdir -p /tmp/old
[[ -d /tmp/old/fishserve ]] || tar xzf .exp/r27old.tgz -C /tmp/old; ln -sfn $PWD/.exp /tmp/old/.exp
F="--max-decode-batch 16 --early-chunk-margin 0.12 --engine-sms 56 --boost-frames 64 --async-scheduling --first-chunk-deadline 0.15"
gcs() { echo "$1: $(grep -c 'garbage collection of generation 2' /tmp/serve_$1.log) gen-2 pauses logged" | tee -a $LOG; }
export PROCS=2 DUR=30 STOP_S=300
run_server A5 "$F" 832 864 2>&1 | tee -a $LOG; gcs A5
cd $OUT && tar czf res.tgz A5 2>/dev/null; rm -rf A5; echo "total $((SECONDS-T0)) s" | tee -a $LOG
