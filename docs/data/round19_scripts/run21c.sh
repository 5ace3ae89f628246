export PYTHONPATH=$PWD/.exp/old; timeout 80 python3 .exp/fidelity.py old 2>&1 | grep -v Warn | tail -3
export PYTHONPATH=$PWD; timeout 80 python3 .exp/fidelity.py new 2>&1 | grep -v Warn | tail -3
timeout 100 python3 -m pytest -q -p no:cacheprovider tests/models/test_triton_head.py -k "gpu or half" -rs 2>&1 | tail -4
