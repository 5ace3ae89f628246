"""Which engines agree on CUDA: k=0/k=8 x graphs/eager/graphs-without-fallback-graphs."""
import sys

sys.path[:0] = [".", "tests"]
import torch  # noqa: E402
from conftest import TINY_T2S, load_tiny_model, make_engine, run_engine  # noqa: E402

from fishserve.engine.engine import GenerationRequest  # noqa: E402
from fishserve.models.tokenizer import FishTokenizer  # noqa: E402

tok = FishTokenizer(TINY_T2S)
model = load_tiny_model().cuda()
reqs = [GenerationRequest("Hello there.", max_new_tokens=6, ignore_eos=True, request_id=f"r{i}") for i in range(3)]
res = {}
for name, kw, drop in [
    ("k0_graph", dict(top_k_prefilter=0), False),
    ("k8_graph", dict(top_k_prefilter=8), False),
    ("k8_graph_eagerfb", dict(top_k_prefilter=8), True),
    ("k0_eager", dict(top_k_prefilter=0, enforce_eager=True), False),
    ("k8_eager", dict(top_k_prefilter=8, enforce_eager=True), False),
]:
    e = make_engine(model, tok, **kw)
    g = e.runner.graphs
    if g is not None:
        print(name, "fallback buckets", {b: sorted(c.fallback) for b, c in g.graphs.items()})
        if drop:
            for c in g.graphs.values():
                c.fallback.clear()
    out = run_engine(e, reqs)
    res[name] = {r: c for r, (c, _) in out.items()}
    print(name, "full_sort_rows", e.stats().full_sort_rows, {r: c.tolist()[0] for r, c in res[name].items()})
names = list(res)
for a in names:
    print(a, [b for b in names if all(torch.equal(res[a][r], res[b][r]) for r in res[a])])
