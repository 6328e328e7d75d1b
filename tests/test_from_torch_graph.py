"""from_torch of modules with their own forward(), read by tracing it with torch.fx: the
networks of PyTorch's tutorials (float64, against the module's own output), and what it
refuses, named by the node of forward() it comes from."""

from __future__ import annotations

import numpy as np
import pytest

from helpers.gradcheck import rel_error


def _networks(torch):
    """name -> (module, per-sample shape in PyTorch's layout, token ids?, sparknet's layers)."""
    nn, F = torch.nn, torch.nn.functional

    class MnistNet(nn.Module):  # PyTorch's MNIST example, with softmax for log_softmax
        def __init__(self):
            super().__init__()
            self.conv1, self.conv2 = nn.Conv2d(1, 4, 3, 1), nn.Conv2d(4, 6, 3, 1)
            self.dropout1, self.dropout2 = nn.Dropout(0.25), nn.Dropout(0.5)
            self.fc1, self.fc2 = nn.Linear(6 * 5 * 5, 16), nn.Linear(16, 10)

        def forward(self, x):
            x = F.relu(self.conv2(F.relu(self.conv1(x))))
            x = torch.flatten(self.dropout1(F.max_pool2d(x, 2)), 1)
            x = self.dropout2(F.relu(self.fc1(x)))
            return F.softmax(self.fc2(x), dim=1)

    class BasicBlock(nn.Module):  # torchvision's
        def __init__(self, c_in, c, stride=1):
            super().__init__()
            self.conv1 = nn.Conv2d(c_in, c, 3, stride=stride, padding=1, bias=False)
            self.bn1, self.relu = nn.BatchNorm2d(c), nn.ReLU()
            self.conv2 = nn.Conv2d(c, c, 3, padding=1, bias=False)
            self.bn2 = nn.BatchNorm2d(c)
            self.downsample = None
            if stride != 1 or c_in != c:
                self.downsample = nn.Sequential(
                    nn.Conv2d(c_in, c, 1, stride=stride, bias=False), nn.BatchNorm2d(c))

        def forward(self, x):
            identity = x
            out = self.relu(self.bn1(self.conv1(x)))
            out = self.bn2(self.conv2(out))
            if self.downsample is not None:
                identity = self.downsample(x)
            out += identity
            return self.relu(out)

    class ResNet(nn.Module):  # torchvision's layout: stem, maxpool, stages, avgpool, fc
        def __init__(self):
            super().__init__()
            self.conv1 = nn.Conv2d(2, 4, 7, stride=2, padding=3, bias=False)
            self.bn1, self.relu = nn.BatchNorm2d(4), nn.ReLU(inplace=True)
            self.maxpool = nn.MaxPool2d(kernel_size=3, stride=2, padding=1)
            self.layer1 = nn.Sequential(BasicBlock(4, 4), BasicBlock(4, 4))
            self.layer2 = BasicBlock(4, 6, stride=2)
            self.avgpool, self.fc = nn.AdaptiveAvgPool2d(1), nn.Linear(6, 3)

        def forward(self, x):
            x = self.maxpool(self.relu(self.bn1(self.conv1(x))))
            x = self.avgpool(self.layer2(self.layer1(x)))
            return self.fc(x.view(x.size(0), -1))

    class RecurrentNet(nn.Module):
        def __init__(self, kind, read):
            super().__init__()
            self.rnn = getattr(nn, kind)(4, 5, num_layers=2, batch_first=True)
            self.fc, self.read = nn.Linear(5, 3), read

        def forward(self, x):
            if self.read == "out":
                out, _ = self.rnn(x)
                return self.fc(out[:, -1, :])
            if self.read == "h, c":
                _, (h, _) = self.rnn(x)
                return self.fc(h[-1])
            _, h = self.rnn(x)
            return self.fc(h[-1])

    class Encoder(nn.Module):
        def __init__(self, pre_norm):
            super().__init__()
            self.pre_norm = pre_norm
            self.emb = nn.Embedding(12, 8)
            self.attn = nn.MultiheadAttention(8, 2, batch_first=True)
            self.norm1, self.norm2 = nn.LayerNorm(8), nn.LayerNorm(8)
            self.ff = nn.Sequential(nn.Linear(8, 16), nn.GELU(), nn.Linear(16, 8))
            self.out = nn.Linear(8, 3)

        def forward(self, ids):
            x = self.emb(ids)
            if self.pre_norm:
                h = self.norm1(x)
                x = x + self.attn(h, h, h, need_weights=False)[0]
                x = x + self.ff(self.norm2(x))
            else:
                x = self.norm1(x + self.attn(x, x, x)[0])
                x = self.norm2(x + self.ff(x))
            return self.out(x.mean(dim=1))

    class TextCNN(nn.Module):
        def __init__(self):
            super().__init__()
            self.emb, self.conv = nn.Embedding(12, 6), nn.Conv1d(6, 5, 3)
            self.pool, self.fc = nn.AdaptiveMaxPool1d(1), nn.Linear(5, 2)

        def forward(self, ids):
            x = F.relu(self.conv(self.emb(ids).transpose(1, 2)))
            return self.fc(self.pool(x).squeeze(-1))

    class LlamaBlock(nn.Module):  # RMSNorm, then a SwiGLU feed-forward, added
        def __init__(self):
            super().__init__()
            self.norm = nn.RMSNorm(8)
            self.w1, self.w3 = nn.Linear(8, 16, bias=False), nn.Linear(8, 16, bias=False)
            self.w2, self.head = nn.Linear(16, 8, bias=False), nn.Linear(8, 3)

        def forward(self, x):
            h = self.norm(x)
            x = x + self.w2(F.silu(self.w1(h)) * self.w3(h))
            return self.head(x.mean(dim=1))

    class Inception(nn.Module):  # branches joined on the channels; a DenseNet-style concat
        def __init__(self):
            super().__init__()
            self.b1 = nn.Conv2d(2, 3, 1)
            self.b2 = nn.Sequential(nn.Conv2d(2, 4, 1), nn.ReLU(), nn.Conv2d(4, 4, 3, padding=1))
            self.pool, self.grow = nn.MaxPool2d(3, 1, 1), nn.Conv2d(9, 2, 3, padding=1)
            self.fc = nn.Linear(11 * 6 * 6, 2)

        def forward(self, x):
            x = F.relu(torch.cat([self.b1(x), self.b2(x), self.pool(x)], dim=1))
            x = torch.cat([x, self.grow(x)], 1)
            return self.fc(torch.flatten(x, 1))

    return {
        "llama block": (LlamaBlock(), (5, 8), False,
                        ["Residual", "GlobalAveragePooling1D", "Dense"]),
        "inception": (Inception(), (2, 6, 6), False,
                      ["Parallel", "Activation", "Parallel", "Flatten", "Dense"]),
        "mnist example": (MnistNet(), (1, 14, 14), False,
                          ["Conv2D", "Conv2D", "MaxPool2D", "Dropout", "Flatten", "Dense",
                           "Dropout", "Dense"]),
        "resnet blocks": (ResNet(), (2, 16, 16), False,
                          ["Conv2D", "BatchNormalization", "Activation", "MaxPool2D",
                           "Residual", "Activation", "Residual", "Activation",
                           "Residual", "Activation", "GlobalAveragePooling2D", "Dense"]),
        "lstm out[:, -1]": (RecurrentNet("LSTM", "out"), (7, 4), False, ["LSTM", "LSTM", "Dense"]),
        "lstm h[-1]": (RecurrentNet("LSTM", "h, c"), (7, 4), False, ["LSTM", "LSTM", "Dense"]),
        "gru h[-1]": (RecurrentNet("GRU", "h"), (7, 4), False, ["GRU", "GRU", "Dense"]),
        "encoder post-norm": (Encoder(False), (9,), True,
                              ["Embedding", "Residual", "LayerNormalization", "Residual",
                               "LayerNormalization", "GlobalAveragePooling1D", "Dense"]),
        "encoder pre-norm": (Encoder(True), (9,), True,
                             ["Embedding", "Residual", "Residual", "GlobalAveragePooling1D",
                              "Dense"]),
        "text cnn": (TextCNN(), (9,), True,
                     ["Embedding", "Conv1D", "GlobalMaxPooling1D", "Dense"]),
    }


def _randomize(torch, module):
    gen = torch.Generator().manual_seed(0)
    module = module.double().eval()
    with torch.no_grad():
        for p in module.parameters():
            p.copy_(torch.randn(p.shape, generator=gen, dtype=torch.float64) * 0.4)
        for m in module.modules():
            if isinstance(m, torch.nn.BatchNorm2d):
                m.running_mean.copy_(torch.rand(m.num_features, generator=gen, dtype=torch.float64))
                m.running_var.copy_(torch.rand(m.num_features, generator=gen, dtype=torch.float64) + 0.5)
    return module


@pytest.mark.parametrize("name", ["llama block", "inception", "mnist example", "resnet blocks", "lstm out[:, -1]", "lstm h[-1]",
                                  "gru h[-1]", "encoder post-norm", "encoder pre-norm", "text cnn"])
def test_a_module_with_its_own_forward_computes_the_same_function(torch, name):
    """The traced module becomes a channels-last sparknet model of the expected layers,
    computing the module's function (float64), and goes back to torch with it."""
    from sparknet.interop import from_torch, to_torch

    module, shape, ids, kinds = _networks(torch)[name]
    module = _randomize(torch, module)
    rng = np.random.default_rng(1)
    x = rng.integers(0, 12, (5,) + shape) if ids else rng.standard_normal((5,) + shape)
    with torch.no_grad():
        want = module(torch.from_numpy(x)).numpy()
    model = from_torch(module, shape)
    assert [type(layer).__name__ for layer in model.layers] == kinds
    assert model.dtype == np.float64
    if name == "resnet blocks":  # the stride-2 block's downsample is its shortcut
        block = model.layers[8]
        assert [type(layer).__name__ for layer in block.shortcut] == ["Conv2D",
                                                                      "BatchNormalization"]
        assert model.layers[4].shortcut is None and block.output_shape == (2, 2, 6)
        # torch's padding=3 and padding=1 on an even image: explicit, not sparknet's "same"
        assert model.layers[0].padding == (3, 3) and model.layers[3].padding == (1, 1)
    x_last = np.moveaxis(x, 1, -1) if len(shape) == 3 else x
    err = rel_error(model.predict_output(x_last), want)
    print(f"from_torch {name}: float64 rel {err:.1e}")
    assert err <= 1e-13
    with torch.no_grad():
        again = to_torch(model)(torch.from_numpy(x_last)).numpy()
    assert rel_error(again, want) <= 1e-13


def test_a_residual_mlp_trained_in_torch_predicts_the_same_digits(torch, digits):
    """A user's own module, trained in PyTorch on the digits, comes in as float32 and
    predicts what it predicts."""
    from sparknet.interop import from_torch

    nn, F = torch.nn, torch.nn.functional

    class Net(nn.Module):
        def __init__(self):
            super().__init__()
            self.inp, self.norm = nn.Linear(64, 32), nn.LayerNorm(32)
            self.block = nn.Sequential(nn.Linear(32, 32), nn.SiLU(), nn.Linear(32, 32))
            self.head = nn.Linear(32, 10)

        def forward(self, x):
            x = F.relu(self.inp(x))
            x = self.norm(x + self.block(x))
            return self.head(x)

    Xtr, ytr, Xte, yte = digits
    torch.manual_seed(0)
    net = Net()
    opt = torch.optim.Adam(net.parameters(), lr=1e-2)
    xb, yb = torch.from_numpy(Xtr.astype(np.float32)), torch.from_numpy(ytr.astype(np.int64))
    for _ in range(60):
        loss = F.cross_entropy(net(xb), yb)
        opt.zero_grad()
        loss.backward()
        opt.step()
    net.eval()
    model = from_torch(net)  # the input shape is the first Linear's
    assert model.input_shape == (64,) and model.dtype == np.float32
    with torch.no_grad():
        want = net(torch.from_numpy(Xte.astype(np.float32))).numpy()
    got = model.predict_output(Xte.astype(np.float32))
    assert rel_error(got, want) <= 1e-5
    accuracy = float((got.argmax(1) == yte).mean())
    print(f"trained in torch, predicted by sparknet: accuracy {accuracy:.3f}")
    assert (got.argmax(1) == want.argmax(1)).all() and accuracy >= 0.9


def _refused(torch):
    """(module, input shape, the message's pattern) for what from_torch cannot read."""
    nn, F = torch.nn, torch.nn.functional

    class Net(nn.Module):
        def __init__(self, forward, **modules):
            super().__init__()
            self._forward = forward
            for k, v in modules.items():
                setattr(self, k, v)

        def forward(self, x):
            return self._forward(self, x)

    pos = Net(lambda s, x: s.fc(x + s.pos), fc=nn.Linear(4, 2))
    pos.pos = nn.Parameter(torch.zeros(4))
    return [
        (Net(lambda s, x: s.fc(x + x), fc=nn.Linear(4, 2)), (4,),
         r"Net.forward\(\), at 'add': adds a tensor to itself"),
        (Net(lambda s, x: F.log_softmax(s.fc(x), dim=1), fc=nn.Linear(4, 2)), (4,),
         r"at 'log_softmax': sparknet has no log-softmax output.*F.softmax\(x, dim=1\)"),
        (pos, (4,), r"at 'pos': reads 'pos' directly \(a parameter or buffer used outside"),
        (Net(lambda s, x: s.fc(x) if x.sum() > 0 else x, fc=nn.Linear(4, 4)), (4,),
         r"could not trace Net.forward\(\) with torch.fx .*branches or loops on tensor values"),
        (Net(lambda s, x: s.fc(s.rnn(x)[0][:, -1]), rnn=nn.GRU(4, 3, batch_first=True,
                                                                bidirectional=True),
             fc=nn.Linear(6, 2)), (5, 4),
         r"the last step of a bidirectional GRU, which is not both directions' final state"),
        (Net(lambda s, x: s.fc(s.fc(x)), fc=nn.Linear(4, 4)), (4,),
         r"at 'fc_1': calls 'fc' a second time \(first at 'fc'\); sparknet layers do not share"),
        (Net(lambda s, x: torch.cat([s.a(x), s.b(x)], 2), a=nn.Conv2d(2, 3, 1), b=nn.Conv2d(2, 3, 1)),
         (2, 4, 4), r"at 'cat': torch.cat on dim 2 of \[\(3, 4, 4\), \(3, 4, 4\)\]; sparknet "
                    r"joins branches on the channel"),
        (Net(lambda s, x: s.a(x) * 2, a=nn.Linear(4, 2)), (4,),
         r"at 'mul': operator.mul has no sparknet equivalent"),
        (Net(lambda s, x: s.attn(x, F.relu(x), F.relu(x))[0],
             attn=nn.MultiheadAttention(4, 1, batch_first=True)), (5, 4),
         r"attention with different queries, keys and values"),
        (Net(lambda s, x: s.fc(F.max_pool2d(s.conv(x), 2).view(-1, 7)), conv=nn.Conv2d(1, 2, 3),
             fc=nn.Linear(7, 2)), (1, 6, 6),
         r"at 'view': reshapes samples of 8 values \(2, 2, 2\) to rows of 7"),
        (Net(lambda s, x: s.fc(x[:, 0]), fc=nn.Linear(4, 2)), (5, 4),
         r"at 'getitem': indexes a tensor with \(slice\(None, None, None\), 0\)"),
    ]


def test_what_a_traced_forward_cannot_express_is_named_where_it_is(torch):
    from sparknet.interop import from_torch

    for module, shape, message in _refused(torch):
        with pytest.raises(ValueError, match=message):
            from_torch(module, shape)


def test_a_traced_module_that_starts_elsewhere_than_a_linear_names_its_input_shape(torch):
    from sparknet.interop import from_torch

    nn = torch.nn

    class Net(nn.Module):
        def __init__(self):
            super().__init__()
            self.features = nn.Sequential(nn.Conv2d(3, 4, 3), nn.ReLU())
            self.fc = nn.Linear(4, 2)

        def forward(self, x):
            return self.fc(torch.flatten(torch.nn.functional.adaptive_avg_pool2d(self.features(x), 1), 1))

    with pytest.raises(ValueError, match=r"needs input_shape: module 'features.0' \(Conv2d\) reads "
                                         r"images \(C, H, W\).*input_shape=\(3, 28, 28\)"):
        from_torch(Net())
    model = from_torch(Net(), (3, 6, 6))
    assert model.input_shape == (6, 6, 3)
