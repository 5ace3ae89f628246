source .exp/gpu.sh
cp .exp/site/sitecustomize.py /tmp/site/
mkdir -p /tmp/b
L=$OUT/log.txt
F="--decoder-sms 96 --max-decode-batch 16 --first-chunk-deadline 0.17 --early-chunk-margin 0.12"
export STOP_S=420 PROCS=2 DUR=30 FS_PROBE=1
run_server Q2 "$F" 320 384 448 > /tmp/b/Q2.txt 2>&1
python3 .exp/summ.py /tmp/b | tee -a $L
grep -E "skip|died|up after|cores|   [0-9]" /tmp/b/Q2.txt | tee -a $L
python3 .exp/probe_summ.py /tmp/b/probe_Q2_l320 >> $L
python3 .exp/probe_summ.py /tmp/b/probe_Q2_l384 /tmp/b/probe_Q2_l320 >> $L
python3 .exp/probe_summ.py /tmp/b/probe_Q2_l448 /tmp/b/probe_Q2_l384 >> $L
cp /tmp/b/Q2.txt $OUT/Q2/
cd $OUT && tar czf Q2.tgz Q2 && rm -rf Q2
du -sh /tmp/torchinductor_* ~/.triton/cache 2>&1 | tee -a $L
tar czf $OUT/cache.tgz -C / tmp/torchinductor_$(whoami) ${HOME#/}/.triton/cache 2>&1 | tail -2; ls -la $OUT | tee -a $L
