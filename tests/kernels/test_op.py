"""Selection attention as a torch op: torch.library's own checks of the registration (schema,
fake tensors, autograd), `torch.compile(fullgraph=True)` over a small model that calls it
(forward and backward, against eager and the fp64 reference), also on CUDA tensors under both
aot_eager and inductor (which generates code around the op), the varlen entry compiled the same
way, and CUDA-graph capture and replay of the auto path with new inputs."""

from __future__ import annotations

import pytest
import torch

from selgate.kernels import selection_attention, selection_attention_varlen
from selgate.kernels.op import selection_attention_op, varlen_to_batched_op
from selgate.reference import normalize_ranges, selection_attention_ref
from selgate.reference.varlen import varlen_to_batched
from tests.helpers import clean_dispatcher, random_inputs  # noqa: F401 (a fixture)

pytestmark = pytest.mark.usefixtures("clean_dispatcher")
ON_GPU = torch.cuda.is_available()


def op_args(requires_grad=False, return_lse=True, **kw):
    q, k, v, r = random_inputs(dtype=torch.float32, requires_grad=requires_grad, **kw)
    return (q, k, v, r, None, None, "auto", None, False, return_lse)


@pytest.mark.parametrize("return_lse", [True, False])
def test_torch_library_checks_the_registration(return_lse):
    torch.library.opcheck(selection_attention_op, op_args(requires_grad=True, return_lse=return_lse))


class Block(torch.nn.Module):
    """Projections around selection attention: parameters receive gradients through the op."""

    def __init__(self, G: int, h: int, D: int):
        super().__init__()
        self.G, self.h = G, h
        self.q = torch.nn.Linear(D, G * h * D)
        self.out = torch.nn.Linear(G * h * D, D)

    def forward(self, x, k, v, ranges):
        B, S, D = x.shape
        o, lse = selection_attention(self.q(x).view(B, S, self.G, self.h, D), k, v, ranges, return_lse=True)
        return self.out(o.flatten(2)) + lse.nan_to_num(neginf=0.0).sum()  # empty rows have lse = -inf


def train_step(model, *inputs):
    model.zero_grad(set_to_none=True)
    k, v = (t.detach().requires_grad_() for t in inputs[1:3])
    loss = model(inputs[0], k, v, inputs[3]).square().mean()
    loss.backward()
    return loss.detach(), [p.grad for p in model.parameters()] + [k.grad, v.grad]


def block_inputs(device, dtype, seed=0, B=2, S=6, G=2, D=16, S_kv=48, n=3):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(B, S, D, generator=g, dtype=torch.float64)
    k = torch.randn(B, G, S_kv, D, generator=g, dtype=torch.float64)
    v = torch.randn(B, G, S_kv, D, generator=g, dtype=torch.float64)
    ranges = torch.randint(-2, S_kv + 3, (B, S, G, n, 2), generator=g)
    return [t.to(device, dtype) for t in (x, k, v)] + [ranges.to(device)]


@pytest.mark.parametrize(
    "device,dtype,backend,tol",
    [("cpu", torch.float32, "aot_eager", 1e-5)]
    + (
        [
            ("cuda", dtype, backend, tol)
            for backend in ("aot_eager", "inductor")
            for dtype, tol in ((torch.float32, 1e-4), (torch.bfloat16, 3e-2))
        ]
        if ON_GPU
        else []
    ),
)
def test_compiled_model_matches_eager_forward_and_backward(device, dtype, backend, tol):
    torch.manual_seed(0)
    model = Block(G=2, h=2, D=16).to(device, dtype)
    compiled = torch.compile(model, fullgraph=True, backend=backend)  # fullgraph: a graph break is an error
    for seed in (1, 2):  # the second call runs the compiled graph again on fresh inputs
        inputs = block_inputs(device, dtype, seed)
        loss_e, grads_e = train_step(model, *inputs)
        loss_c, grads_c = train_step(compiled, *inputs)
        assert torch.allclose(loss_c, loss_e, rtol=tol, atol=tol)
        for ge, gc in zip(grads_e, grads_c):
            assert gc is not None and torch.allclose(gc.float(), ge.float(), rtol=tol, atol=tol * ge.abs().max().item())


def test_compiled_call_matches_the_reference():
    q, k, v, r = random_inputs(dtype=torch.float32, seed=4)
    f = torch.compile(lambda q, k, v: selection_attention(q, k, v, r, return_lse=True), fullgraph=True, backend="aot_eager")
    o, lse = f(q, k, v)
    o_ref, lse_ref = selection_attention_ref(q, k, v, r, return_lse=True)
    assert (o.double() - o_ref).abs().max() <= 1e-5
    finite = torch.isfinite(lse_ref)
    assert torch.equal(torch.isfinite(lse), finite) and (lse.double() - lse_ref)[finite].abs().max() <= 1e-5


def varlen_inputs(seed: int, G=2, h=2, D=16, lens_q=(3, 1, 4), lens_k=(9, 5, 12), n=3):
    """Three packed sequences with sequence-local raw ranges, and their offsets."""
    g = torch.Generator().manual_seed(seed)
    T_q, T_kv = sum(lens_q), sum(lens_k)
    q = torch.randn(1, T_q, G, h, D, generator=g)
    k, v = (torch.randn(1, G, T_kv, D, generator=g) for _ in range(2))
    ranges = torch.randint(-2, max(lens_k) + 2, (1, T_q, G, n, 2), generator=g)
    cu = [torch.tensor([0, *torch.tensor(x).cumsum(0).tolist()], dtype=torch.int32) for x in (lens_q, lens_k)]
    return q, k, v, ranges, *cu


def test_torch_library_checks_the_varlen_registration():
    _, k, _, ranges, cu_q, cu_k = varlen_inputs(0)
    torch.library.opcheck(varlen_to_batched_op, (ranges, cu_q, cu_k, k.shape[2]))


@pytest.mark.parametrize("device,tol", [("cpu", 1e-5)] + ([("cuda", 1e-4)] if ON_GPU else []))
def test_a_compiled_varlen_call_matches_eager_and_the_reference_forward_and_backward(device, tol):
    """fullgraph: the offsets' checks (host reads) run inside an op, not as graph breaks."""
    f = torch.compile(
        lambda q, k, v, r, cq, ck: selection_attention_varlen(q, k, v, r, cq, ck, return_lse=True),
        fullgraph=True,
        backend="aot_eager",
    )
    for seed in (1, 2):  # the second call runs the compiled graph on fresh inputs
        q, k, v, r, cq, ck = (t.to(device) for t in varlen_inputs(seed))
        outs, grads = [], []
        for fn in (f, selection_attention_varlen):
            leaves = [t.clone().requires_grad_() for t in (q, k, v)]
            o, lse = fn(*leaves, r, cq, ck) if fn is f else fn(*leaves, r, cq, ck, return_lse=True)
            (o.square().sum() + lse.nan_to_num(neginf=0.0).sum()).backward()
            outs.append(o.detach())
            grads.append([t.grad for t in leaves])
        glob, pos = varlen_to_batched(r, cq, ck, T_kv=k.shape[2])
        ref = selection_attention_ref(q, k, v, glob, positions=pos)
        assert (outs[0].double() - ref).abs().max() <= tol and torch.allclose(outs[0], outs[1], atol=tol / 10)
        for gc, ge in zip(*grads):
            assert torch.allclose(gc, ge, atol=tol)


@pytest.mark.skipif(not ON_GPU, reason="needs a CUDA device")
@pytest.mark.parametrize("normalized", [False, True])
def test_cuda_graph_replays_the_auto_path_on_new_inputs(normalized):
    sets = [block_inputs("cuda", torch.bfloat16, seed, S=1, S_kv=1024, n=8)[1:] for seed in range(3)]
    make_q = [torch.randn(2, 1, 2, 4, 16, device="cuda", dtype=torch.bfloat16) for _ in sets]
    ranges = [normalize_ranges(r, 1024) for *_, r in sets]
    q, (k, v, _), r = make_q[0].clone(), [t.clone() for t in sets[0]], ranges[0].clone()
    selection_attention(q, k, v, r, normalized=normalized)  # warm-up outside capture
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        o = selection_attention(q, k, v, r, normalized=normalized)
    for i in (1, 2, 0):
        q.copy_(make_q[i])
        k.copy_(sets[i][0])
        v.copy_(sets[i][1])
        r.copy_(ranges[i])
        graph.replay()
        torch.cuda.synchronize()
        eager = selection_attention(make_q[i], sets[i][0], sets[i][1], ranges[i], normalized=normalized)
        assert torch.equal(o, eager)
        assert (o.double() - selection_attention_ref(make_q[i], *sets[i][:2], ranges[i])).abs().max() <= 0.05
