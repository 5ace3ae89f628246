# Planned first call of the next round (not run yet). Set up here first, as round 23's
# next_round.sh says (wheels, .exp/gpu.sh, .exp/summ.py with the boost share), plus
#   git archive 0bf2852 fishserve | gzip > .exp/old.tgz
# then on the device with carry [".whl", ".exp"], timeout 600. (1) The lease's host probe and
# the engine alone under load on the server's 56 engine SMs (bench-engine-load, new tree: what
# the engine's partition sustains without the decoder; the GPU test of --engine-sms first); (2) the server at 640 streams with the new tree and round 24's (0bf2852), A-B-A, at a
# level that passes on a normal lease, so a difference is not a collapse's spread.
source .exp/gpu.sh >/dev/null; mkdir -p /tmp/b /tmp/old; LOG=$OUT/log.txt; T0=$SECONDS
tar xzf .exp/old.tgz -C /tmp/old && ln -sfn $PWD/.exp /tmp/old/.exp
python3 -c "from fishserve.host_probe import host_probe_ms as p; print('probe ms', p())" | tee -a $LOG
timeout 90 python3 -m pytest -p no:cacheprovider --junitxml=$OUT/t.xml -k sm_partition tests/bench/test_engine_load.py 2>&1 | tail -2 | tee -a $LOG
timeout 200 python3 -m fishserve bench-engine-load --streams 512,768,1024 --modes async \
  --duration 8 --engine-sms 56 --output $OUT/load.json 2>&1 | tail -8 | tee -a $LOG
F="--max-decode-batch 16 --early-chunk-margin 0.12 --engine-sms 56 --boost-frames 64 --async-scheduling --first-chunk-deadline 0.15"
export PROCS=2 DUR=30 STOP_S=$((T0 + 540))
run_server N1 "$F" 640 > /tmp/b/N1.txt 2>&1
( cd /tmp/old && export PYTHONPATH=/tmp/site:/tmp/old && run_server O1 "$F" 640 ) > /tmp/b/O1.txt 2>&1
run_server N2 "$F" 640 > /tmp/b/N2.txt 2>&1
for t in N1 O1 N2; do echo "-- $t"; grep -vE "^\s*$" /tmp/b/$t.txt | tail -6; done | tee -a $LOG
cd $OUT && rm -f */serve.log && tar czf res.tgz N1 O1 N2 && rm -rf N1 O1 N2
