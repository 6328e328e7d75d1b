"""RMSprop and SGD over the flat buffer against an independent numpy re-implementation
(and against torch.optim when torch is importable)."""
import itertools

import numpy as np
import pytest

from sparknet.optim import SGD, RMSprop, get


def ref_rmsprop(p, grads, lr, alpha, eps, wd, momentum, centered):
    p = p.copy()
    v = np.zeros_like(p)
    ga = np.zeros_like(p)
    buf = np.zeros_like(p)
    for g in grads:
        g = g + wd * p if wd else g.copy()
        v = alpha * v + (1 - alpha) * g * g
        if centered:
            ga = alpha * ga + (1 - alpha) * g
            avg = np.sqrt(v - ga * ga) + eps
        else:
            avg = np.sqrt(v) + eps
        if momentum > 0:
            buf = momentum * buf + g / avg
            p = p - lr * buf
        else:
            p = p - lr * g / avg
    return p


def ref_sgd(p, grads, lr, momentum, dampening, wd, nesterov):
    p = p.copy()
    buf = None
    for g in grads:
        g = g + wd * p if wd else g.copy()
        if momentum:
            buf = g.copy() if buf is None else momentum * buf + (1 - dampening) * g
            g = g + momentum * buf if nesterov else buf
        p = p - lr * g
    return p


def _data(n=50, steps=7, seed=0):
    rng = np.random.default_rng(seed)
    return rng.standard_normal(n), [rng.standard_normal(n) for _ in range(steps)]


RMS_OPTIONS = list(itertools.product([0.9, 0.99], [1e-8, 1e-3], [0.0, 0.1], [0.0, 0.9], [False, True]))


@pytest.mark.parametrize("alpha,eps,wd,momentum,centered", RMS_OPTIONS)
def test_rmsprop_matches_numpy_reference(alpha, eps, wd, momentum, centered):
    p0, grads = _data()
    opt = RMSprop(lr=0.01, alpha=alpha, eps=eps, weight_decay=wd, momentum=momentum, centered=centered)
    p = p0.copy()
    for g in grads:
        opt.step(p, g.copy())
    want = ref_rmsprop(p0, grads, 0.01, alpha, eps, wd, momentum, centered)
    np.testing.assert_allclose(p, want, rtol=1e-13, atol=1e-15)
    assert opt.t == len(grads)


SGD_OPTIONS = [(0, 0, 0, False), (0.9, 0, 0, False), (0.9, 0.3, 0, False), (0.9, 0, 0, True),
               (0, 0, 0.05, False), (0.8, 0.1, 0.05, False), (0.9, 0, 0.05, True)]


@pytest.mark.parametrize("momentum,dampening,wd,nesterov", SGD_OPTIONS)
def test_sgd_matches_numpy_reference(momentum, dampening, wd, nesterov):
    p0, grads = _data(seed=1)
    opt = SGD(lr=0.05, momentum=momentum, dampening=dampening, weight_decay=wd, nesterov=nesterov)
    p = p0.copy()
    for g in grads:
        opt.step(p, g.copy())
    np.testing.assert_allclose(p, ref_sgd(p0, grads, 0.05, momentum, dampening, wd, nesterov),
                               rtol=1e-13, atol=1e-15)


@pytest.mark.parametrize("alpha,eps,wd,momentum,centered", RMS_OPTIONS[::3])
def test_rmsprop_matches_torch(alpha, eps, wd, momentum, centered):
    torch = pytest.importorskip("torch", reason="torch not installed: torch comparison skipped")
    p0, grads = _data(seed=2)
    t = torch.tensor(p0.copy(), requires_grad=True)
    topt = torch.optim.RMSprop([t], lr=0.01, alpha=alpha, eps=eps, weight_decay=wd,
                               momentum=momentum, centered=centered)
    opt = RMSprop(lr=0.01, alpha=alpha, eps=eps, weight_decay=wd, momentum=momentum, centered=centered)
    p = p0.copy()
    for g in grads:
        t.grad = torch.tensor(g.copy())
        topt.step()
        opt.step(p, g.copy())
    np.testing.assert_allclose(p, t.detach().numpy(), rtol=1e-12, atol=1e-14)


def test_float32_update_agrees_with_float64():
    p0, grads = _data(seed=3)
    p64, p32 = p0.copy(), p0.astype(np.float32)
    o64, o32 = RMSprop(lr=0.01, momentum=0.5, centered=True), RMSprop(lr=0.01, momentum=0.5, centered=True)
    for g in grads:
        o64.step(p64, g.copy())
        o32.step(p32, g.astype(np.float32))
    np.testing.assert_allclose(p32, p64, rtol=1e-4, atol=1e-5)


def test_state_dict_round_trip_continues_identically():
    p0, grads = _data(seed=4)
    a = RMSprop(lr=0.01, momentum=0.9, centered=True)
    pa = p0.copy()
    for g in grads[:3]:
        a.step(pa, g.copy())
    b = RMSprop(lr=0.01, momentum=0.9, centered=True)
    b.load_state_dict(a.state_dict())
    pb = pa.copy()
    for g in grads[3:]:
        a.step(pa, g.copy())
        b.step(pb, g.copy())
    np.testing.assert_array_equal(pa, pb)


def test_bad_optimizer_arguments():
    with pytest.raises(ValueError, match="learning rate"):
        RMSprop(lr=0)
    with pytest.raises(ValueError, match="alpha"):
        RMSprop(alpha=1.5)
    with pytest.raises(ValueError, match="Nesterov"):
        SGD(nesterov=True)
    with pytest.raises(ValueError, match="unknown optimizer"):
        get("adagrad")
    with pytest.raises(ValueError, match="same shape|one shape"):
        SGD().step(np.zeros(3), np.zeros(4))


@pytest.mark.parametrize("opt", [
    SGD(lr=0.5), SGD(lr=0.1, momentum=0.9, weight_decay=0.3), SGD(lr=0.2, momentum=0.8, nesterov=True),
    SGD(lr=0.1, momentum=0.5, dampening=0.5), RMSprop(lr=0.05), RMSprop(lr=0.01, alpha=0.5, weight_decay=0.2),
    RMSprop(lr=0.02, momentum=0.9),
], ids=repr)
def test_step_bound_holds_for_every_step(opt):
    """What divergence checking relies on: step_bound bounds the change to the parameters,
    the momentum buffer and the decayed gradient (gradients of wildly varying scale)."""
    rng = np.random.default_rng(7)
    n = 500
    p = rng.standard_normal(n)
    carry, pbound = 0.0, float(np.linalg.norm(p))
    for k in range(60):
        g = rng.standard_normal(n) * 10.0 ** rng.integers(-4, 4)
        g[rng.random(n) < 0.3] = 0.0
        bound, carry = opt.step_bound(float(np.linalg.norm(g)), pbound, n, carry)
        decayed = g + opt.weight_decay * p
        before = p.copy()
        opt.step(p, g.copy())
        slack = 1 + 1e-9
        assert np.linalg.norm(p - before) <= bound * slack, k
        assert np.linalg.norm(decayed) <= bound * slack, k
        if "momentum_buffer" in opt.state:
            assert np.linalg.norm(opt.state["momentum_buffer"]) <= carry * slack, k
        pbound += bound
        assert np.linalg.norm(p) <= pbound * slack


def test_centered_rmsprop_gives_no_step_bound():
    assert RMSprop(centered=True).step_bound(1.0, 1.0, 10, 0.0)[0] == float("inf")
