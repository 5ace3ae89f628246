# Round 21, call 4 (as run, inline): the GPU tests of the SM partitions after the graphs could
# be captured on the partition's stream (confine_graphs), counted from a JUnit report.
source .exp/gpu.sh >/dev/null
timeout 240 python3 -m pytest -q -p no:cacheprovider tests/engine/test_sm_partition.py -rs \
  --junitxml=$OUT/junit.xml > $OUT/pytest.txt 2>&1; echo rc=$?
grep -oE 'tests="[0-9]+"|failures="[0-9]+"|errors="[0-9]+"|skipped="[0-9]+"' $OUT/junit.xml | head -4
grep -E "^E |FAILED|SKIPPED" $OUT/pytest.txt | head -20
