# Round 26, device call 2 (carry [".whl", ".exp"]; .exp/r26old.tgz = git archive 5b1d78d
# fishserve). GPU tests of the engine (prefilter ties, async steps inside the static rows,
# CUDA graphs); then the engine alone on 56 engine SMs at 768 and 1024 streams, new tree
# (a0d5e4f), the tree before (5b1d78d), new again.
source .exp/gpu.sh >/dev/null; LOG=$OUT/log.txt; mkdir -p /tmp/old; T0=$SECONDS
tar xzf .exp/r26old.tgz -C /tmp/old
python3 -m fishserve probe 2>&1 | tee -a $LOG
timeout 170 python3 -m pytest -p no:cacheprovider --junitxml=$OUT/t.xml -k "cuda or gpu or graph or triton or prefilter or static_rows" \
  tests/engine 2>&1 | grep -E "passed|failed|Error" | tail -3 | tee -a $LOG
A="--streams 768,1024 --modes async --duration 6 --warmup 2 --engine-sms 56"
bel() { timeout 140 python3 -m fishserve bench-engine-load $A --output $OUT/$1.json 2>&1 | grep -E "^│|probe" | tee -a $LOG; }
echo "-- new" | tee -a $LOG; bel new1
echo "-- old" | tee -a $LOG; (cd /tmp/old && export PYTHONPATH=/tmp/site:/tmp/old && bel old1)
if (( SECONDS - T0 < 440 )); then echo "-- new" | tee -a $LOG; bel new2; fi
rm -f $OUT/*.md
