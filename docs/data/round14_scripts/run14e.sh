source .exp/gpu.sh
mkdir -p /tmp/b
L=$OUT/log.txt
cat /proc/sys/net/core/somaxconn /proc/sys/net/ipv4/tcp_max_syn_backlog | tr '\n' ' ' | tee -a $L; echo | tee -a $L
python3 .exp/lo.py | tee -a $L
F="--decoder-sms 96 --max-decode-batch 16 --first-chunk-deadline 0.17 --early-chunk-margin 0.12"
export STOP_S=300
( sleep 185; for i in 1 2 3 4 5 6; do ss -ltn "sport = :18201" | tail -1; python3 .exp/lo.py; sleep 8; done ) > /tmp/b/ss.txt 2>&1 &
run_server P4 "$F" 384 > /tmp/b/P4.txt 2>&1
python3 .exp/summ.py /tmp/b | tee -a $L
python3 .exp/lo.py | tee -a $L
cat /tmp/b/ss.txt | tee -a $L
cd $OUT && tar czf P4.tgz P4 && rm -rf P4
