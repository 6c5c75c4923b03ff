# Reproduces root cause `dk: NaN where 0 is expected` (37 failure(s)) of `selgate check fla_nsa:selection`
# on its smallest case, `test_conformance.py::test_bounds[fla_nsa:selection-decode-B2S1Skv37-G2h16-D16x16-n4-adjacent-bs64-fp32-s0]`.
# Run it from the directory `selgate check` ran in (where the implementation's module is).
# Exit status 1 while the case fails, 0 once it passes (`git bisect run python <this file>`).
import os
import sys

from selgate.conformance.cases import make_inputs
from selgate.conformance.compare import ConformanceFailure
from selgate.conformance.families import FAMILIES
from selgate.conformance.registry import resolve
from selgate.reference import selection_attention_ref
from selgate.reports.triage import find_case

sys.path.insert(0, os.getcwd())
DEVICE = 'cuda'
impl = resolve('fla_nsa:selection', declare='/work/main/examples/fla_nsa.yaml')[0]
case = find_case(impl, 'decode-B2S1Skv37-G2h16-D16x16-n4-adjacent-bs64-fp32-s0', 'tiny')
inp = make_inputs(case, DEVICE)
q, k, v, ranges = inp.q, inp.k, inp.v, inp.ranges
o, lse = impl.forward(q, k, v, ranges, scale=inp.scale)
o_ref, lse_ref = selection_attention_ref(q.double(), k.double(), v.double(), ranges, scale=inp.scale, return_lse=True)
print(f"o {tuple(o.shape)} {o.dtype}, reference {tuple(o_ref.shape)}")
print(f"NaN in o: {int(o.isnan().sum())}, in the reference: {int(o_ref.isnan().sum())}")
if o.shape == o_ref.shape:
    print(f"o: max abs err {(o.double() - o_ref).abs().nan_to_num(0.0).max().item():.3e}")
try:
    FAMILIES['bounds'].check(impl, case, DEVICE)
    print("bounds: passed on this case")
except ConformanceFailure as e:
    print(f"bounds FAILED: {e}")
    sys.exit(1)
