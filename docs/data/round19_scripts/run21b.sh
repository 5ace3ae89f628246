# session 21 call: SiLU in the epilogue. Head A/B, GPU tests, then the server (sync) at 448 512 576
source .exp/gpu.sh
mkdir -p /tmp/b
LOG=$OUT/log.txt
git log --oneline -1 | tee -a $LOG; git status --short | head | tee -a $LOG
PYTHONPATH=/tmp/site:$PWD/.exp/old python3 .exp/head_ab.py old 2>&1 | grep -v Warn | tee -a $LOG
PYTHONPATH=/tmp/site:$PWD python3 .exp/head_ab.py new 2>&1 | grep -v Warn | tee -a $LOG
timeout 200 python3 -m pytest -q -p no:cacheprovider tests/models/test_triton_head.py tests/audio/test_decoder_runner.py -rs 2>&1 | grep -E "passed|failed|SKIP|Error|assert" | tail -12 | tee -a $LOG
F="--decoder-sms 96 --max-decode-batch 16 --first-chunk-deadline 0.17 --early-chunk-margin 0.12"
export PROCS=2 DUR=30 STOP_S=${STOP_S:-500}
run_server E1 "$F" 448 512 576 > /tmp/b/E1.txt 2>&1
python3 .exp/summ.py /tmp/b | tee -a $LOG
grep -E "skip|died|up after" /tmp/b/E1.txt | tee -a $LOG
(cd $OUT && tar czf E1.tgz E1 && rm -rf E1)
