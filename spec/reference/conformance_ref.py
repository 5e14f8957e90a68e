# PyTorch side of spec/conformance_spec.lua: for each case, one line
#   name|dtype|values|grad   (values and the gradient of sum(out) as space-separated numbers; an op
#   with several outputs gives their dtypes comma-separated and their values in turn);
#   name|error|message| where torch raises
import math, sys, torch
nan, inf = math.nan, math.inf
X = [-1.5, -0.5, 0.0, 0.25, 0.5, 2.5, nan, inf, -inf]
LEAVES = []
AS_F32 = False  # bfloat16 cases where torch 1.13 has no bfloat16 kernel: float32 on bfloat16-rounded values
def t(v, dt, g=False):
    if AS_F32 and dt == torch.bfloat16: dt, v = torch.float32, torch.tensor(v, dtype=torch.bfloat16).float().tolist()
    x = torch.tensor(v, dtype=dt, requires_grad=g)
    if g: LEAVES.append(x)
    return x
unary = {"relu": torch.relu, "gelu": torch.nn.functional.gelu, "silu": torch.nn.functional.silu,
         "sin": torch.sin, "cos": torch.cos, "erf": torch.erf, "expm1": torch.expm1, "softplus": torch.nn.functional.softplus,
         "sign": torch.sign, "floor": torch.floor, "ceil": torch.ceil, "round": torch.round, "trunc": torch.trunc,
         "sigmoid": torch.sigmoid, "tanh": torch.tanh, "exp": torch.exp, "abs": torch.abs}
cases = {}
for dn, dt in (("float64", torch.float64), ("float32", torch.float32), ("bfloat16", torch.bfloat16)):
    for n, f in unary.items(): cases[f"{n} {dn}"] = (lambda f=f, dt=dt: f(t(X, dt, True)), True)
    cases[f"gelu tanh {dn}"] = (lambda dt=dt: torch.nn.functional.gelu(t(X, dt, True), approximate="tanh"), True)
    cases[f"log1p {dn}"] = (lambda dt=dt: torch.log1p(t([0.0, 0.5, 3.0, -0.5, inf], dt, True)), True)
    cases[f"clamp min>max {dn}"] = (lambda dt=dt: torch.clamp(t(X, dt, True), 3, 2), True)
    cases[f"max ties {dn}"] = (lambda dt=dt: t([[1.0, 5.0], [5.0, 2.0]], dt, True).max(), True)
    cases[f"min nan {dn}"] = (lambda dt=dt: t([1.0, nan, 0.0, nan], dt, True).min(), True)
    cases[f"maximum nan/tie {dn}"] = (lambda dt=dt: torch.maximum(t([1.0, nan, 3.0, 2.0], dt, True), t([2.0, 2.0, nan, 2.0], dt)), True)
    cases[f"minimum broadcast {dn}"] = (lambda dt=dt: torch.minimum(t([[1.0], [4.0]], dt, True), t([2.0, 2.0, 5.0], dt)), True)
    cases[f"max axis -1 keepdim {dn}"] = (lambda dt=dt: t([[1.0, 5.0, 5.0], [nan, 2.0, 3.0]], dt, True).max(-1, keepdim=True)[0], True)
    cases[f"relu transposed {dn}"] = (lambda dt=dt: torch.relu(t([[1.0, -2.0, nan], [-0.5, 3.0, 0.0]], dt, True).t()), True)
    cases[f"sin 0-d {dn}"] = (lambda dt=dt: torch.sin(t(0.7, dt, True)), True)
    cases[f"erf size-0 {dn}"] = (lambda dt=dt: torch.erf(t([], dt, True)), True)
    L3 = [[[1.0, -2.0], [0.5, 3.0], [-1.5, 0.25]], [[2.0, 0.0], [-0.5, 1.5], [4.0, -3.0]]]
    T3 = [[0, -100], [2, 1]]
    F = torch.nn.functional
    cases[f"cross_entropy [N,C,d1] mean {dn}"] = (lambda dt=dt: F.cross_entropy(t(L3, dt, True), torch.tensor(T3)), True)
    cases[f"cross_entropy [N,C,d1] none {dn}"] = (lambda dt=dt: F.cross_entropy(t(L3, dt, True), torch.tensor(T3), reduction="none"), True)
    cases[f"cross_entropy [N,C,d1,d2] sum ignore_index 1 {dn}"] = (lambda dt=dt: F.cross_entropy(
        t([L3[0], L3[1], L3[0]], dt, True).view(1, 3, 3, 2), torch.tensor([[[1, 0], [2, 1], [0, 2]]]), ignore_index=1, reduction="sum"), True)
    cases[f"logsumexp axis 1 {dn}"] = (lambda dt=dt: torch.logsumexp(t([[1.0, -2.0, 3.0], [0.5, -inf, 0.25]], dt, True), 1), True)
    cases[f"logsumexp all keepdim {dn}"] = (lambda dt=dt: torch.logsumexp(t(L3, dt, True), (0, 1, 2), keepdim=True), True)
    cases[f"std axis 0 {dn}"] = (lambda dt=dt: torch.std(t(L3, dt, True), 0), True)
    cases[f"std biased {dn}"] = (lambda dt=dt: torch.std(t(L3, dt, True), (1, 2), unbiased=False, keepdim=True), True)
    cases[f"mse_loss {dn}"] = (lambda dt=dt: F.mse_loss(t(L3, dt, True), t(L3, dt) * 0.5), True)
    cases[f"mse_loss none {dn}"] = (lambda dt=dt: F.mse_loss(t([1.0, -2.0, 3.0], dt, True), t([0.5, 0.0, 3.0], dt), reduction="none"), True)
    cases[f"nll_loss [N,C,d1] {dn}"] = (lambda dt=dt: F.nll_loss(t(L3, dt, True), torch.tensor(T3)), True)
    cases[f"nll_loss sum ignore_index 2 {dn}"] = (lambda dt=dt: F.nll_loss(t([[1.0, -2.0, 0.5], [3.0, -1.5, 0.25]], dt, True),
        torch.tensor([2, 0]), ignore_index=2, reduction="sum"), True)
    cases[f"bce_with_logits {dn}"] = (lambda dt=dt: F.binary_cross_entropy_with_logits(
        t([-30.0, -1.5, 0.0, 0.5, 2.5, 40.0], dt, True), t([0.0, 1.0, 0.5, 1.0, 0.0, 1.0], dt)), True)
    cases[f"bce_with_logits weight none {dn}"] = (lambda dt=dt: F.binary_cross_entropy_with_logits(
        t([-1.5, 0.0, 2.5], dt, True), t([1.0, 0.5, 0.0], dt), weight=t([2.0, 1.0, 0.5], dt), reduction="none"), True)
    cases[f"cumsum axis 1 nan/inf {dn}"] = (lambda dt=dt: torch.cumsum(t([[1.0, nan, 3.0], [inf, 2.0, -inf]], dt, True), 1), True)
    cases[f"cumsum axis -2 transposed {dn}"] = (lambda dt=dt: torch.cumsum(t(L3, dt, True).transpose(1, 2), -2), True)
    cases[f"cumsum 0-d {dn}"] = (lambda dt=dt: torch.cumsum(t(2.5, dt, True), 0), True)
    cases[f"cumsum size-0 {dn}"] = (lambda dt=dt: torch.cumsum(torch.zeros(2, 0, dtype=dt), 1), False)
    cases[f"flip axes 0,-1 {dn}"] = (lambda dt=dt: torch.flip(t(L3, dt, True), (0, -1)), True)
    cases[f"flip transposed nan/inf {dn}"] = (lambda dt=dt: torch.flip(t([[1.0, nan, 3.0], [inf, 2.0, -inf]], dt, True).transpose(0, 1), (1,)), True)
    cases[f"flip size-0 {dn}"] = (lambda dt=dt: torch.flip(torch.zeros(0, 3, dtype=dt), (0, 1)), False)
    cases[f"prod all {dn}"] = (lambda dt=dt: torch.prod(t(L3, dt, True)), True)
    cases[f"prod one zero {dn}"] = (lambda dt=dt: torch.prod(t([1.5, 0.0, -2.0, 3.0], dt, True)), True)
    cases[f"prod two zeros {dn}"] = (lambda dt=dt: torch.prod(t([1.5, 0.0, -2.0, 0.0], dt, True)), True)
    cases[f"prod axis -1 keepdim zeros {dn}"] = (lambda dt=dt: torch.prod(
        t([[1.5, 0.0, -2.0], [0.0, 0.0, 3.0], [0.5, 4.0, -1.0]], dt, True), -1, keepdim=True), True)
    cases[f"prod axis 0 transposed zeros {dn}"] = (lambda dt=dt: torch.prod(
        t([[1.5, 0.0, -2.0], [0.0, 0.5, 3.0]], dt, True).transpose(0, 1), 1), True)
    cases[f"prod nan/inf {dn}"] = (lambda dt=dt: torch.prod(t([[2.0, nan], [inf, -0.5]], dt), 1), False)
    cases[f"prod 0-d {dn}"] = (lambda dt=dt: torch.prod(t(2.5, dt, True)), True)
    cases[f"prod size-0 {dn}"] = (lambda dt=dt: torch.prod(torch.zeros(2, 0, dtype=dt), 1), False)
    cases[f"roll axes 0,-1 {dn}"] = (lambda dt=dt: torch.roll(t(L3, dt, True), (1, -4), (0, -1)), True)
    cases[f"roll flat transposed {dn}"] = (lambda dt=dt: torch.roll(t([[1.0, nan, 3.0], [inf, 2.0, -inf]], dt, True).transpose(0, 1), 4), True)
    cases[f"roll size-0 {dn}"] = (lambda dt=dt: torch.roll(torch.zeros(0, 3, dtype=dt), 2, 0), False)
    S2 = [[3.0, 1.0, nan, 1.0, -0.5], [2.0, -inf, 2.0, inf, 0.0]]
    cases[f"sort nan/ties {dn}"] = (lambda dt=dt: torch.sort(t(S2, dt, True)), True)
    cases[f"sort axis 1 descending transposed {dn}"] = (lambda dt=dt: torch.sort(t(L3, dt, True).transpose(1, 2), 1, descending=True), True)
    cases[f"sort axis 0 stable descending {dn}"] = (lambda dt=dt: torch.sort(t(S2, dt, True), dim=0, descending=True, stable=True), True)
    cases[f"sort 0-d {dn}"] = (lambda dt=dt: torch.sort(t(2.5, dt, True)), True)
    cases[f"sort size-0 {dn}"] = (lambda dt=dt: torch.sort(torch.zeros(2, 0, dtype=dt), 1), False)
    cases[f"argsort descending nan {dn}"] = (lambda dt=dt: torch.argsort(t(S2, dt), -1, descending=True), False)
    cases[f"topk 2 nan/inf {dn}"] = (lambda dt=dt: torch.topk(t([[3.0, 1.0, nan, 0.5], [2.0, -inf, 5.0, inf]], dt, True), 2), True)
    cases[f"topk smallest axis 0 {dn}"] = (lambda dt=dt: torch.topk(t(L3, dt, True), 1, 0, largest=False), True)
    cases[f"topk axis -2 transposed {dn}"] = (lambda dt=dt: torch.topk(t(L3, dt, True).transpose(1, 2), 1, -2, largest=True), True)
    cases[f"topk k 0 {dn}"] = (lambda dt=dt: torch.topk(t([[1.0, 2.0]], dt), 0), False)
    cases[f"unbind axis -1 {dn}"] = (lambda dt=dt: torch.unbind(t(L3, dt, True), -1), True)
    cases[f"unbind transposed {dn}"] = (lambda dt=dt: torch.unbind(t(S2, dt, True).transpose(0, 1)), True)
    cases[f"repeat leading axis {dn}"] = (lambda dt=dt: t([[1.0, nan], [inf, -2.0]], dt, True).repeat(2, 1, 3), True)
    cases[f"repeat transposed {dn}"] = (lambda dt=dt: t(L3, dt, True).transpose(0, 2).repeat(1, 2, 2), True)
    cases[f"repeat 0-d {dn}"] = (lambda dt=dt: t(2.5, dt, True).repeat(3), True)
    cases[f"repeat zero times {dn}"] = (lambda dt=dt: t([1.0, 2.0], dt, True).repeat(2, 0), True)
    cases[f"tile short reps {dn}"] = (lambda dt=dt: torch.tile(t([[1.0, 2.0], [3.0, 4.0]], dt, True), (3,)), True)
    cases[f"masked_select broadcast {dn}"] = (lambda dt=dt: torch.masked_select(t(S2, dt, True), torch.tensor([True, False, True, True, False])), True)
    cases[f"masked_select mask wider {dn}"] = (lambda dt=dt: torch.masked_select(t([[1.0], [nan]], dt, True),
        torch.tensor([[True, False, True], [False, True, True]])), True)
    cases[f"masked_select none {dn}"] = (lambda dt=dt: torch.masked_select(t([1.0, 2.0], dt, True), torch.tensor([False, False])), True)
    A, D = [5.5, -5.5, 5.5, -5.5, 3.0, -0.0, nan, inf, 2.0], [3.0, 3.0, -3.0, -3.0, 1.5, 2.0, 1.0, 2.0, inf]
    cases[f"remainder signs {dn}"] = (lambda dt=dt: torch.remainder(t(A, dt, True), t(D, dt)), True)
    cases[f"fmod signs {dn}"] = (lambda dt=dt: torch.fmod(t(A, dt, True), t(D, dt)), True)
    cases[f"floor_divide signs {dn}"] = (lambda dt=dt: torch.floor_divide(t(A, dt), t(D, dt)), False)
    cases[f"remainder by zero {dn}"] = (lambda dt=dt: torch.remainder(t([1.0, -1.0, 0.0], dt), 0.0), False)
    cases[f"fmod by zero {dn}"] = (lambda dt=dt: torch.fmod(t([1.0, -1.0, 0.0], dt), 0.0), False)
    cases[f"floor_divide by zero {dn}"] = (lambda dt=dt: torch.floor_divide(t([1.0, -1.0, 0.0], dt), 0.0), False)
    cases[f"remainder divisor gradient {dn}"] = (lambda dt=dt: torch.remainder(t([5.5, -5.5], dt), t([[3.0], [-2.0]], dt, True)), True)
    cases[f"fmod divisor gradient transposed {dn}"] = (lambda dt=dt: torch.fmod(t([[7.0, -7.0], [2.5, 4.0]], dt),
        t([[2.0, -2.0], [3.0, -3.0]], dt, True).transpose(0, 1)), True)
    cases[f"a % b {dn}"] = (lambda dt=dt: t([-7.5, 7.5], dt, True) % 2, True)
    cases[f"a // b {dn}"] = (lambda dt=dt: t([-7.5, 7.5, 0.5], dt) // -2, False)
    cases[f"div trunc gradient {dn}"] = (lambda dt=dt: torch.div(t([7.5, -7.5], dt, True), 2, rounding_mode="trunc"), True)
    cases[f"div floor 0-d {dn}"] = (lambda dt=dt: torch.div(t(-7.0, dt), t(2.0, dt), rounding_mode="floor"), False)
    P, Y = [0.0, 1e-50, 0.25, 0.5, 0.9, 1.0, 1.0, 0.0], [0.0, 1.0, 0.0, 0.5, 1.0, 0.0, 1.0, 1.0]
    cases[f"binary_cross_entropy clamps {dn}"] = (lambda dt=dt: F.binary_cross_entropy(t(P, dt, True), t(Y, dt), reduction="none"), True)
    cases[f"binary_cross_entropy mean {dn}"] = (lambda dt=dt: F.binary_cross_entropy(t(P, dt, True), t(Y, dt)), True)
    cases[f"binary_cross_entropy weight sum {dn}"] = (lambda dt=dt: F.binary_cross_entropy(t([[0.1, 0.7], [0.3, 1.0]], dt, True),
        t([[0.0, 1.0], [0.2, 1.0]], dt), weight=t([2.0, 0.5], dt), reduction="sum"), True)
    cases[f"binary_cross_entropy 0-d {dn}"] = (lambda dt=dt: F.binary_cross_entropy(t(0.3, dt, True), t(1.0, dt)), True)
    cases[f"binary_cross_entropy target gradient {dn}"] = (lambda dt=dt: F.binary_cross_entropy(t([0.2, 0.6, 1.0], dt),
        t([0.0, 0.4, 1.0], dt, True), reduction="sum"), True)
    cases[f"where promoted gradient {dn}"] = (lambda dt=dt: torch.where(torch.tensor([True, False, True]), t([1.5, nan, -2.0], dt, True),
        torch.tensor([1, 2, 3])), True)
    cases[f"cat promoted gradient {dn}"] = (lambda dt=dt: torch.cat([t([[1.5, 2.0]], dt, True), torch.tensor([[1, 2]])], 0), True)
    V, M2 = [1.5, -2.0, 0.5], [[1.0, -1.0, 2.0], [0.5, 3.0, -0.25]]
    cases[f"matmul vector . vector {dn}"] = (lambda dt=dt: torch.matmul(t(V, dt, True), t([2.0, 1.0, -4.0], dt)), True)
    cases[f"matmul matrix . vector {dn}"] = (lambda dt=dt: torch.matmul(t(M2, dt), t(V, dt, True)), True)
    cases[f"matmul vector . matrix {dn}"] = (lambda dt=dt: torch.matmul(t([2.0, -1.0], dt, True), t(M2, dt)), True)
    cases[f"matmul batched . vector {dn}"] = (lambda dt=dt: torch.matmul(t([M2, M2], dt, True), t(V, dt)), True)
    cases[f"matmul vector . batched transposed {dn}"] = (lambda dt=dt: torch.matmul(t(V, dt, True), t([M2, M2], dt).transpose(1, 2)), True)
    cases[f"matmul size-0 vector {dn}"] = (lambda dt=dt: torch.matmul(torch.zeros(0, dtype=dt), torch.zeros(0, dtype=dt)), False)
    cases[f"linear 1-d input {dn}"] = (lambda dt=dt: F.linear(t(V, dt, True), t(M2, dt), t([0.5, -1.0], dt)), True)
    W2 = [[0.5, -1.0], [2.0, 1.5], [1.0, 0.25]]
    cases[f"layer_norm over two axes {dn}"] = (lambda dt=dt: F.layer_norm(t(L3, dt, True), (3, 2), t(W2, dt),
        t([[0.0, 1.0], [-1.0, 0.5], [0.25, 0.0]], dt), 1e-5), True)
    cases[f"layer_norm last axis, integer shape {dn}"] = (lambda dt=dt: F.layer_norm(t(L3, dt, True).transpose(0, 1), (2,)), True)
    cases[f"layer_norm weight only eps {dn}"] = (lambda dt=dt: F.layer_norm(t(L3, dt, True), (2,), t([2.0, -0.5], dt), None, 0.1), True)
    Q3 = [[[0.5, -1.0, 0.25], [1.0, 0.0, -0.5]], [[-0.75, 0.5, 2.0], [0.1, 0.2, 0.3]]]
    K3 = [[[1.0, 0.5, -0.5], [0.0, -1.0, 1.0], [0.25, 0.75, 0.5]], [[-1.0, 2.0, 0.0], [0.5, 0.5, 0.5], [1.5, -0.5, 1.0]]]
    def sdpa(q, k, v, causal=False, scale=None):  # torch 2's F.scaled_dot_product_attention, written out
        s = q @ k.transpose(-2, -1) * (scale if scale is not None else 1 / math.sqrt(q.shape[-1]))
        if causal:
            s = s.masked_fill(torch.ones(q.shape[-2], k.shape[-2], dtype=torch.bool).triu(1), -inf)
        return torch.softmax(s, -1) @ v
    cases[f"attention 3-d {dn}"] = (lambda dt=dt: sdpa(t(Q3, dt, True), t(K3, dt), t(K3, dt)), True)
    cases[f"attention 3-d causal Tq < Tk {dn}"] = (lambda dt=dt: sdpa(t(Q3, dt, True), t(K3, dt), t(K3, dt), causal=True), True)
    cases[f"attention 4-d scale {dn}"] = (lambda dt=dt: sdpa(t([Q3], dt, True), t([K3], dt), t([K3], dt), scale=0.5), True)
    cases[f"topk 0-d {dn}"] = (lambda dt=dt: torch.topk(t(2.5, dt, True), 1), True)
    cases[f"sort size-0 1-d {dn}"] = (lambda dt=dt: torch.sort(torch.zeros(0, dtype=dt)), False)
    cases[f"masked_select size-0 {dn}"] = (lambda dt=dt: torch.masked_select(torch.zeros(0, 2, dtype=dt), torch.tensor([True, False])), False)
    cases[f"repeat size-0 {dn}"] = (lambda dt=dt: t([[1.0, 2.0]], dt).repeat(0, 2), False)
    cases[f"remainder 0-d divisor broadcast {dn}"] = (lambda dt=dt: torch.remainder(t([[-3.5, 4.0], [7.0, -0.5]], dt, True), t(-2.0, dt)), True)
    cases[f"where 0-d operands {dn}"] = (lambda dt=dt: torch.where(torch.tensor([True, False]), t(1.5, dt, True), t(-2.0, dt)), True)
    cases[f"any axis 1 {dn}"] = (lambda dt=dt: torch.any(t([[0.0, nan], [0.0, 0.0]], dt), 1), False)
    cases[f"all {dn}"] = (lambda dt=dt: torch.all(t([[1.0, inf], [-2.0, 0.0]], dt)), False)
    TT = [[[1.0, -2.0], [3.0, -2.0]], [[-2.0, 0.5], [3.0, 3.0]]]
    cases[f"amax axis 1 nan/ties {dn}"] = (lambda dt=dt: torch.amax(t([[1.0, 5.0, 5.0], [nan, 2.0, nan]], dt, True), 1), True)
    cases[f"amin axes 0,-1 keepdim ties {dn}"] = (lambda dt=dt: torch.amin(t(TT, dt, True), (0, -1), keepdim=True), True)
    cases[f"amax all ties {dn}"] = (lambda dt=dt: torch.amax(t(TT, dt, True)), True)
    cases[f"amax method transposed {dn}"] = (lambda dt=dt: t(TT, dt, True).transpose(0, 2).amax(0), True)
    cases[f"amin inf {dn}"] = (lambda dt=dt: torch.amin(t([[inf, -inf, 1.0], [inf, inf, inf]], dt, True), 1), True)
    cases[f"amax method axis -1 keepdim {dn}"] = (lambda dt=dt: t([[0.5, 0.5], [-1.0, 2.0]], dt, True).amax(-1, keepdim=True), True)
    cases[f"amax 0-d {dn}"] = (lambda dt=dt: torch.amax(t(2.5, dt, True), 0), True)
    cases[f"amin 0-d all {dn}"] = (lambda dt=dt: torch.amin(t(-1.5, dt, True)), True)
    cases[f"amax size-0 kept axis {dn}"] = (lambda dt=dt: torch.amax(torch.zeros(0, 3, dtype=dt), 1), False)
    HX, XB = [-1.5, -1.0, -0.5, 0.0, 1.0, 1.5, inf, -inf], [-1.5, -0.5, 0.0, 0.25, 0.5, 2.5, 3.0, inf, -inf]
    cases[f"hardtanh bounds inf {dn}"] = (lambda dt=dt: F.hardtanh(t(HX, dt, True)), True)
    cases[f"hardtanh nan {dn}"] = (lambda dt=dt: F.hardtanh(t(X, dt)), False)
    cases[f"hardtanh min_val max_val {dn}"] = (lambda dt=dt: F.hardtanh(t(XB, dt, True), -0.5, 2.5), True)
    cases[f"hardtanh options max_val {dn}"] = (lambda dt=dt: F.hardtanh(t(XB, dt, True), max_val=0.25), True)
    cases[f"hardtanh min>max {dn}"] = (lambda dt=dt: F.hardtanh(t(XB, dt, True), 2.0, 1.0), True)
    cases[f"hardtanh 0-d at bound {dn}"] = (lambda dt=dt: F.hardtanh(t(1.0, dt, True)), True)
    cases[f"relu6 bounds inf {dn}"] = (lambda dt=dt: F.relu6(t([-1.0, 0.0, 3.0, 6.0, 7.0, inf, -inf], dt, True)), True)
    cases[f"relu6 nan {dn}"] = (lambda dt=dt: F.relu6(t(X, dt)), False)
    cases[f"relu6 transposed {dn}"] = (lambda dt=dt: F.relu6(t([[0.0, 6.5, -2.0], [6.0, 2.5, 7.0]], dt, True).t()), True)
    cases[f"relu6 size-0 {dn}"] = (lambda dt=dt: F.relu6(torch.zeros(0, 2, dtype=dt)), False)
    cases[f"nn.Hardtanh {dn}"] = (lambda dt=dt: torch.nn.Hardtanh(-0.5, 0.5)(t(XB, dt, True)), True)
    cases[f"nn.ReLU6 {dn}"] = (lambda dt=dt: torch.nn.ReLU6()(t(XB, dt, True)), True)
    cases[f"clamp_min nan {dn}"] = (lambda dt=dt: torch.clamp_min(t(X, dt, True), 0.25), True)
    cases[f"clamp_max method {dn}"] = (lambda dt=dt: t(X, dt, True).clamp_max(0.5), True)
    cases[f"bool * float nan gradient {dn}"] = (lambda dt=dt: torch.tensor([True, False]) * t([1.5, nan], dt, True), True)
cases["amax int64 axes"] = (lambda: torch.amax(torch.tensor([[[1, 7], [3, -4]], [[9, 2], [0, 5]]]), (0, 2)), False)
cases["amin int32 keepdim"] = (lambda: torch.amin(torch.tensor([[1, 7], [3, -4]], dtype=torch.int32), 1, keepdim=True), False)
cases["amax bool"] = (lambda: torch.amax(torch.tensor([[True, False], [False, False]]), 1), False)
cases["amin bool all"] = (lambda: torch.amin(torch.tensor([[True, False], [True, True]])), False)
cases["hardtanh int64"] = (lambda: torch.nn.functional.hardtanh(torch.tensor([-3, -1, 0, 1, 3])), False)
cases["relu6 int64"] = (lambda: torch.nn.functional.relu6(torch.tensor([-3, 0, 6, 7])), False)
BA, BB = [True, False, True, False], [True, True, False, False]
cases["bool + bool"] = (lambda: torch.tensor(BA) + torch.tensor(BB), False)
cases["bool * bool"] = (lambda: torch.tensor(BA) * torch.tensor(BB), False)
cases["maximum bool"] = (lambda: torch.maximum(torch.tensor(BA), torch.tensor(BB)), False)
cases["minimum bool"] = (lambda: torch.minimum(torch.tensor(BA), torch.tensor(BB)), False)
cases["bool / bool"] = (lambda: torch.tensor(BA) / torch.tensor(BB), False)
cases["bool + bool 0-d broadcast"] = (lambda: torch.tensor([[True], [False]]) + torch.tensor(True), False)
cases["bool + true"] = (lambda: torch.tensor(BA) + True, False)
cases["bool * false"] = (lambda: torch.tensor(BA) * False, False)
cases["bool + 1"] = (lambda: torch.tensor(BA) + 1, False)
cases["bool + 1.5"] = (lambda: torch.tensor(BA) + 1.5, False)
cases["bool * 2"] = (lambda: torch.tensor(BA) * 2, False)
cases["bool * int32"] = (lambda: torch.tensor(BA) * torch.tensor([1, 2, 3, 4], dtype=torch.int32), False)
cases["bool + float64 0-d"] = (lambda: torch.tensor(BA) + torch.tensor(0.5, dtype=torch.float64), False)
cases["bool % 2"] = (lambda: torch.tensor(BA) % 2, False)
cases["bool // 2"] = (lambda: torch.tensor(BA) // 2, False)
cases["bool ^ 2"] = (lambda: torch.tensor(BA) ** 2, False)
cases["bool + bool size-0"] = (lambda: torch.zeros(0, dtype=torch.bool) + torch.zeros(0, dtype=torch.bool), False)
cases["bool - bool raises"] = (lambda: torch.tensor(BA) - torch.tensor(BB), False)
cases["bool - true raises"] = (lambda: torch.tensor(BA) - True, False)
cases["bool - 1 raises"] = (lambda: torch.tensor(BA) - 1, False)
cases["1 - bool raises"] = (lambda: 1 - torch.tensor(BA), False)
cases["bool - float32 raises"] = (lambda: torch.tensor(BA) - torch.tensor([1.0, 2.0, 3.0, 4.0]), False)
cases["-bool raises"] = (lambda: -torch.tensor(BA), False)
cases["bool // bool raises"] = (lambda: torch.tensor(BA) // torch.tensor(BB), False)
cases["bool % bool raises"] = (lambda: torch.tensor(BA) % torch.tensor(BB), False)
cases["bool ^ bool raises"] = (lambda: torch.tensor(BA) ** torch.tensor(BB), False)
cases["amax empty axis raises"] = (lambda: torch.amax(torch.zeros(0, 3), 0), False)
cases["amin all of empty raises"] = (lambda: torch.amin(torch.zeros(2, 0)), False)
cases["amax axis twice raises"] = (lambda: torch.amax(torch.zeros(2, 3), (1, -1)), False)
cases["hardtanh bool raises"] = (lambda: torch.nn.functional.hardtanh(torch.tensor(BA)), False)
cases["relu6 bool raises"] = (lambda: torch.nn.functional.relu6(torch.tensor(BA)), False)
cases["one_hot"] = (lambda: torch.nn.functional.one_hot(torch.tensor([[0, 2], [1, 0]])), False)
cases["one_hot num_classes 4"] = (lambda: torch.nn.functional.one_hot(torch.tensor([3, 1]), 4), False)
cases["cumsum int32"] = (lambda: torch.cumsum(torch.tensor([[1, 2], [3, 4]], dtype=torch.int32), 0), False)
cases["cumsum bool"] = (lambda: torch.cumsum(torch.tensor([True, False, True]), 0), False)
cases["flip int64"] = (lambda: torch.flip(torch.tensor([[1, 2, 3], [4, 5, 6]]), (1,)), False)
cases["prod int32"] = (lambda: torch.prod(torch.tensor([[1, 2], [3, -4]], dtype=torch.int32), 0), False)
cases["prod bool"] = (lambda: torch.prod(torch.tensor([True, True])), False)
cases["sort int64 descending ties"] = (lambda: torch.sort(torch.tensor([3, 1, 2, 1, 3, 2]), 0, descending=True), False)
cases["argsort int32"] = (lambda: torch.argsort(torch.tensor([[5, -1, 3], [0, 0, -7]], dtype=torch.int32)), False)
cases["topk int64"] = (lambda: torch.topk(torch.tensor([4, 9, -2, 7]), 3), False)
cases["sort bool"] = (lambda: torch.sort(torch.tensor([True, False, True, False])), False)
cases["repeat int64"] = (lambda: torch.tensor([[1, 2]]).repeat(2, 2), False)
cases["masked_select bool"] = (lambda: torch.masked_select(torch.tensor([True, False, True]), torch.tensor([False, True, True])), False)
I7, I3 = [7, -7, 7, -7, 0], [3, 3, -3, -3, 5]
cases["remainder int64 signs"] = (lambda: torch.remainder(torch.tensor(I7), torch.tensor(I3)), False)
cases["fmod int64 signs"] = (lambda: torch.fmod(torch.tensor(I7), torch.tensor(I3)), False)
cases["floor_divide int64 signs"] = (lambda: torch.floor_divide(torch.tensor(I7), torch.tensor(I3)), False)
cases["floor_divide int32 by -1"] = (lambda: torch.floor_divide(torch.tensor([7, -8], dtype=torch.int32), -1), False)
cases["remainder int64 by float"] = (lambda: torch.remainder(torch.tensor([5, -5]), 2.5), False)
cases["remainder number by int64"] = (lambda: torch.remainder(-3, torch.tensor([2, -2])), False)
cases["fmod int32 + int64"] = (lambda: torch.fmod(torch.tensor([-7, 9], dtype=torch.int32), torch.tensor([2, 4])), False)
cases["int64 % int64"] = (lambda: torch.tensor([-7, 7]) % torch.tensor([2, -2]), False)
cases["int64 // int64"] = (lambda: torch.tensor([-7, 7]) // torch.tensor([2, -2]), False)
cases["remainder size-0"] = (lambda: torch.remainder(torch.zeros(0, 2), torch.ones(2)), False)
TF = torch.tensor([True, False])
cases["where int64, float32"] = (lambda: torch.where(torch.tensor([True, False, True]), torch.tensor([1, 2, 3]), torch.tensor([0.5, 1.5, 2.5])), False)
cases["where int64, 2.5"] = (lambda: torch.where(TF, torch.tensor([1, 2]), 2.5), False)
cases["where float32, 2"] = (lambda: torch.where(TF, torch.tensor([1.5, 2.5]), 2), False)
cases["where int32, int64 0-d"] = (lambda: torch.where(TF, torch.tensor([1, 2], dtype=torch.int32), torch.tensor(5)), False)
cases["where 1, 2.5"] = (lambda: torch.where(TF, 1, 2.5), False)
cases["where bool, float64 broadcast"] = (lambda: torch.where(torch.tensor([[True], [False]]), torch.tensor([True, False]),
    torch.tensor([0.25, 0.5], dtype=torch.float64)), False)
cases["cat int64, float32"] = (lambda: torch.cat([torch.tensor([1, 2]), torch.tensor([0.5])]), False)
cases["cat int32, bool"] = (lambda: torch.cat([torch.tensor([1], dtype=torch.int32), torch.tensor([True])]), False)
cases["cat float32, float64 axis 1"] = (lambda: torch.cat([torch.tensor([[1.5]]), torch.tensor([[2.25, 3.0]], dtype=torch.float64)], 1), False)
cases["stack int64, float64"] = (lambda: torch.stack([torch.tensor([1, 2]), torch.tensor([0.5, 1.5], dtype=torch.float64)]), False)
cases["matmul int64"] = (lambda: torch.matmul(torch.tensor([[1, 2], [3, 4]]), torch.tensor([[5, -6], [7, 8]])), False)
cases["matmul int64 batched broadcast"] = (lambda: torch.matmul(torch.tensor([[[1, 2]], [[3, 4]]]), torch.tensor([[5, -6], [7, 8]])), False)
cases["matmul int64 vectors"] = (lambda: torch.matmul(torch.tensor([1, 2, 3]), torch.tensor([4, 5, -6])), False)
cases["matmul int32 transposed"] = (lambda: torch.matmul(torch.tensor([[1, 2], [3, 4]], dtype=torch.int32).t(), torch.tensor([[1], [-1]], dtype=torch.int32)), False)
cases["index_select int32 index"] = (lambda: torch.index_select(torch.tensor([[1.5, 2.0], [3.0, -1.0], [0.5, 4.0]]), 0, torch.tensor([2, 0, 2], dtype=torch.int32)), False)
cases["embedding int32 ids"] = (lambda: torch.nn.functional.embedding(torch.tensor([[1, 0]], dtype=torch.int32), torch.tensor([[1.5, 2.0], [3.0, -1.0]])), False)
cases["int64 / int64"] = (lambda: torch.tensor([3, 4, -7]) / torch.tensor([2, 0, 2]), False)
cases["int64 + 2.0"] = (lambda: torch.tensor([1, 2]) + 2.0, False)
cases["int64 + 2"] = (lambda: torch.tensor([1, 2]) + 2, False)
cases["int32 + int64"] = (lambda: torch.tensor([1, 2], dtype=torch.int32) + torch.tensor([1, 2]), False)
cases["int32 + int64 0-d"] = (lambda: torch.tensor([1, 2], dtype=torch.int32) + torch.tensor(5), False)
cases["float32 * float64"] = (lambda: torch.tensor([1.5, 2.0]) * torch.tensor([2.0, 3.0], dtype=torch.float64), False)
cases["float32 * float64 0-d"] = (lambda: torch.tensor([1.5, 2.0]) * torch.tensor(2.0, dtype=torch.float64), False)
cases["int64 * float64 0-d"] = (lambda: torch.tensor([1, 2]) * torch.tensor(0.5, dtype=torch.float64), False)
cases["bool * float32"] = (lambda: torch.tensor([True, False]) * torch.tensor([1.5, 2.0]), False)
cases["int64 < 2.5"] = (lambda: (torch.tensor([1, 2, 3]) < 2.5).to(torch.int64), False)
cases["div floor int"] = (lambda: torch.div(torch.tensor([7, -7, 6]), torch.tensor([2, 2, -4]), rounding_mode="floor"), False)
cases["div trunc int"] = (lambda: torch.div(torch.tensor([7, -7, 6]), 2, rounding_mode="trunc"), False)
cases["div floor float"] = (lambda: torch.div(torch.tensor([7.5, -7.5]), 2, rounding_mode="floor"), False)
def fmt(v): return " ".join(repr(float(x)) for x in v.detach().reshape(-1).tolist())
for name in sys.argv[1:]:
    fn, grad = cases[name]
    LEAVES.clear()
    def run():
        LEAVES.clear()
        outs = fn()
        outs = tuple(outs) if isinstance(outs, tuple) else (outs,)  # sort's values and indices: in turn
        if grad: outs[0].sum().backward()
        return outs, fmt(LEAVES[0].grad) if grad else ""
    AS_F32 = False
    try:
        try:
            outs, g = run()
        except RuntimeError as e:
            # torch 1.13 lacks some CPU kernels for bfloat16 (prod, mse, hardshrink's backward, ...):
            # float32 on the same bfloat16 values then stands for it
            if "BFloat16" not in str(e) or not name.endswith(" bfloat16"): raise
            AS_F32 = True
            outs, g = run()
    except (RuntimeError, IndexError) as e:  # flow must raise too, naming the op
        print(f"{name}|error|{str(e).splitlines()[0]}|")
        continue
    dtypes = ",".join(str(o.dtype).replace('torch.', '').replace('float32', 'bfloat16' if AS_F32 else 'float32') for o in outs)
    print(f"{name}|{dtypes}|{' '.join(fmt(o) for o in outs if o.numel())}|{g}")
