# next session, call 1: GPU tests of branch wip/fewer-torch-calls (copied to .exp/wip), then the branch at 384/448
source .exp/gpu.sh
mkdir -p /tmp/b
ln -sfn $PWD/.exp .exp/wip/.exp  # run_server's helper scripts, from inside the branch's tree
LOG=$OUT/log.txt
(cd .exp/wip && timeout 240 python3 -m pytest -q -p no:warnings -rs tests/engine tests/audio/test_decoder_runner.py tests/server/test_decode_worker.py -k "cuda or gpu or graph or slot or pipelin or fallback" 2>&1 | grep -v "nanobind\| - leaked" | tail -15) | tee -a $LOG
F="--decoder-sms 96 --max-decode-batch 16 --first-chunk-deadline 0.17 --early-chunk-margin 0.12"
export PROCS=2 DUR=30 STOP_S=480
(cd .exp/wip && run_server W1 "$F" 384 448) > /tmp/b/W1.txt 2>&1
python3 .exp/summ.py /tmp/b | tee -a $LOG
grep -E "skip|died|up after" /tmp/b/W1.txt | tee -a $LOG
[ -d $OUT/W1 ] && (cd $OUT && tar czf W1.tgz W1 && rm -rf W1)
