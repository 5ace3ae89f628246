# Planned for the next session's first device call (not run yet): the GPU tests cut off this
# round, then the server with the faster head, sync, at 448 512 576 streams. The time guard
# counts from the server's start (run21b.sh's counted from the script's, which skipped every
# level). Carry [".whl", ".exp"] with gpu.sh and summ.py copied into .exp/.
source .exp/gpu.sh
mkdir -p /tmp/b
LOG=$OUT/log.txt
git log --oneline -1 | tee -a $LOG
timeout 240 python3 -m pytest -q -p no:cacheprovider tests/models/test_triton_head.py \
  tests/audio/test_decoder_runner.py -rs 2>&1 | tail -8 | tee -a $LOG
F="--decoder-sms 96 --max-decode-batch 16 --first-chunk-deadline 0.17 --early-chunk-margin 0.12"
export PROCS=2 DUR=30 STOP_S=$((SECONDS + 330))
run_server E1 "$F" 448 512 576 > /tmp/b/E1.txt 2>&1
python3 .exp/summ.py /tmp/b | tee -a $LOG
grep -E "skip|died|up after" /tmp/b/E1.txt | tee -a $LOG
(cd $OUT && tar czf E1.tgz E1 && rm -rf E1)
