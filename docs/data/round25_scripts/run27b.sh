# Round 25, call 2: HEAD vs 0bf2852 (round 24's tree) at 672 streams, async+boost64 D0.15, ABA.
source .exp/gpu.sh >/dev/null; mkdir -p /tmp/b /tmp/old; LOG=$OUT/log.txt; T0=$SECONDS
tar xzf .exp/old.tgz -C /tmp/old && ln -sfn $PWD/.exp /tmp/old/.exp
F="--max-decode-batch 16 --early-chunk-margin 0.12 --engine-sms 56 --boost-frames 64 --async-scheduling --first-chunk-deadline 0.15"
export PROCS=2 DUR=30 STOP_S=$((T0 + 520))
run_server N1 "$F" 672 > /tmp/b/N1.txt 2>&1
( cd /tmp/old && export PYTHONPATH=/tmp/site:/tmp/old && python3 -c "import fishserve; print(fishserve.__file__)" && run_server O1 "$F" 672 ) > /tmp/b/O1.txt 2>&1
run_server N2 "$F" 672 > /tmp/b/N2.txt 2>&1
for t in N1 O1 N2; do echo "-- $t"; grep -vE "^\s*$" /tmp/b/$t.txt | tail -12; done | tee -a $LOG
python3 .exp/summ.py /tmp/b/N1_* /tmp/b/O1_* /tmp/b/N2_* | tee -a $LOG
cd $OUT && rm -f */serve.log && tar czf res.tgz N1 O1 N2 && rm -rf N1 O1 N2
