source .exp/gpu.sh
mkdir -p /tmp/b
L=$OUT/log.txt
nproc | tee -a $L
F="--decoder-sms 96 --max-decode-batch 16 --first-chunk-deadline 0.17 --early-chunk-margin 0.12"
export STOP_S=470 PROCS=4
run_server Q1 "$F" 384 448 512 576 640 768 896 > /tmp/b/Q1.txt 2>&1
python3 .exp/summ.py /tmp/b | tee -a $L
grep -E "skip|died|up after" /tmp/b/Q1.txt | tee -a $L
cd $OUT && tar czf Q1.tgz Q1 && rm -rf Q1
