"""Attention layers: :class:`MultiHeadAttention`, :class:`PositionalEmbedding` and
:class:`TransformerEncoder`.

Sequences are ``(N, T, D)`` (samples, tokens, features), as for the recurrent layers.
The layers follow PyTorch: ``MultiHeadAttention`` is ``torch.nn.MultiheadAttention(D,
num_heads, batch_first=True)`` used as self-attention, with its parameters in the same
layout, and ``TransformerEncoder`` is ``torch.nn.TransformerEncoderLayer(D, num_heads,
ffn_dim, dropout, activation, batch_first=True, norm_first=norm_first)``.

How attention runs (:mod:`sparknet._attention`): one GEMM projects every token of the
batch to its queries, keys and values at once, ``QKV = x W_in^T + b_in`` of shape
``(N T, 3 D)``; then, for each sample and head, two BLAS products (``Q K^T`` and the
weights times ``V``) read their blocks of ``QKV`` in place, with a fused masked softmax
(and attention dropout) between them in a nogil loop; one last GEMM applies the output
projection.  The backward runs the same steps in reverse.

Masks: an ``(N, T)`` sequence mask (``fit(..., mask=)``, or a layer that makes one) marks
the real tokens.  Padded tokens get no attention, the outputs at padded positions of
:class:`MultiHeadAttention` are 0, and the mask is handed on to the layers after it.
"""
from __future__ import annotations

import math
from typing import Any, cast

import numpy as np

import sparknet._attention as _attention
import sparknet._dense as _dense
from sparknet import initializers
from sparknet._validation import check_bool, check_float, check_mask, positive_int
from sparknet.activations import canonical_name
from sparknet.errors import InputRankError
from sparknet.layers.base import Layer, MaskedLayer, ParamSpec, register
from sparknet.layers.container import Container
from sparknet.layers.core import Dense, Dropout
from sparknet.layers.normalization import LayerNormalization

__all__ = ["MultiHeadAttention", "PositionalEmbedding", "TransformerEncoder"]


def _sequence_shape(layer: Layer, input_shape: tuple[int, ...]) -> tuple[int, int]:
    if len(input_shape) != 2:
        raise InputRankError(f"{type(layer).__name__} {layer.name!r} needs sequences of "
                             f"per-sample shape (T, D) (tokens, features), got per-sample shape "
                             f"{tuple(input_shape)}", layout="sequences (T, D)", rank=2,
                             got=input_shape)
    return int(input_shape[0]), int(input_shape[1])


def _rows(x: np.ndarray, width: int, dtype: np.dtype) -> np.ndarray:
    """``x`` as a C-contiguous ``(rows, width)`` array of ``dtype`` (a copy when needed)."""
    return np.ascontiguousarray(np.reshape(x, (-1, width)), dtype=dtype)


def _writable_rows(x: np.ndarray, width: int, dtype: np.dtype) -> np.ndarray:
    a = _rows(x, width, dtype)
    return a if a.flags.writeable else a.copy()


@register
class MultiHeadAttention(Layer):
    """Multi-head scaled dot-product self-attention, as ``torch.nn.MultiheadAttention``.

    Each of the ``num_heads`` heads projects the tokens to queries, keys and values of width
    ``key_dim``, mixes the values with the weights ``softmax(Q K^T / sqrt(key_dim))`` and
    the heads' outputs, side by side, go through an output projection::

        Q, K, V = x W_q^T + b_q, x W_k^T + b_k, x W_v^T + b_v    (W_in = [W_q; W_k; W_v])
        head_h = softmax(Q_h K_h^T / sqrt(key_dim) + masks) V_h
        y = [head_1, ..., head_H] W_out^T + b_out

    With ``key_dim = D / num_heads`` this is ``torch.nn.MultiheadAttention(embed_dim=D,
    num_heads, dropout, bias=use_bias, batch_first=True)`` called as ``mha(x, x, x,
    key_padding_mask=~mask, attn_mask=causal mask)``: the same parameters give the same
    outputs at the real tokens (at padded positions this layer outputs 0).

    Args:
        num_heads: number of heads; a positive integer.
        key_dim: width of each head's queries, keys and values; ``num_heads * key_dim``
            must equal the input width ``D`` (PyTorch's layout).  ``None`` (default) means
            ``D // num_heads``.
        dropout: probability of dropping an attention weight in training (the rest are
            scaled by ``1 / (1 - dropout)``), in ``[0, 1)``; drawn from the layer's
            seeded generator.
        use_bias: learn the projection biases.
        causal: token ``i`` attends to tokens ``j <= i`` only.
        name: layer name.

    Input shape: ``(N, T, D)`` and an optional ``(N, T)`` mask of the real tokens.
    Output shape: ``(N, T, D)``; the mask passes on unchanged.

    Parameters, in ``torch.nn.MultiheadAttention``'s layout: ``in_proj_weight (3 D, D)``
    and ``in_proj_bias (3 D,)`` (queries, keys, values stacked), ``out_proj_weight (D, D)``
    and ``out_proj_bias (D,)`` (PyTorch's ``out_proj.weight`` and ``out_proj.bias``).
    Initialisation: Glorot-uniform weights (as PyTorch for ``in_proj_weight``), zero
    biases.

    A padded key gets no attention; a padded query's output is 0.  A real query that sees
    no key (every key it may see is padded) gets the output 0 (PyTorch gives NaN).
    """

    supports_masking = True

    def __init__(self, num_heads: int, key_dim: int | None = None, dropout: float = 0.0,
                 use_bias: bool = True, causal: bool = False, name: str | None = None) -> None:
        super().__init__(name)
        self.num_heads = positive_int(num_heads, "MultiHeadAttention num_heads")
        self.key_dim = positive_int(key_dim, "MultiHeadAttention key_dim", allow_none=True)
        self.dropout = check_float(dropout, "MultiHeadAttention dropout", 0.0, 1.0,
                                   high_open=True)
        self.use_bias = check_bool(use_bias, "MultiHeadAttention use_bias")
        self.causal = check_bool(causal, "MultiHeadAttention causal")

    def _build(self, input_shape: tuple[int, ...]) -> tuple[int, ...]:
        T, D = _sequence_shape(self, input_shape)
        H = self.num_heads
        if self.key_dim is None:
            if D % H:
                raise ValueError(f"MultiHeadAttention {self.name!r}: the input width D={D} is not "
                                 f"divisible by num_heads={H}; each head takes D / num_heads "
                                 f"features")
        elif self.key_dim * H != D:
            raise ValueError(f"MultiHeadAttention {self.name!r}: num_heads * key_dim must equal "
                             f"the input width D={D} (the projections keep PyTorch's layout), "
                             f"got num_heads={H} and key_dim={self.key_dim} "
                             f"({H * self.key_dim}); use key_dim={D // H if D % H == 0 else None}"
                             f" or a Dense({H * self.key_dim}) layer before it")
        self.steps, self.width = T, D
        self.head_dim = D // H
        return (T, D)

    def param_specs(self) -> list[ParamSpec]:
        D = self.width
        specs: list[ParamSpec] = [("in_proj_weight", (3 * D, D))]
        if self.use_bias:
            specs.append(("in_proj_bias", (3 * D,)))
        specs.append(("out_proj_weight", (D, D)))
        if self.use_bias:
            specs.append(("out_proj_bias", (D,)))
        return specs

    def init_params(self, params: dict[str, np.ndarray], rng: np.random.Generator) -> None:
        D = self.width
        initializers.fill(params["in_proj_weight"], "glorot_uniform", D, 3 * D, rng)
        initializers.fill(params["out_proj_weight"], "glorot_uniform", D, D, rng)
        if self.use_bias:
            params["in_proj_bias"][...] = 0
            params["out_proj_bias"][...] = 0

    def compute_mask(self, mask: np.ndarray | None) -> np.ndarray | None:
        return mask

    # -- computation ------------------------------------------------------
    def forward(self, x: np.ndarray, training: bool = False,
                mask: np.ndarray | None = None) -> np.ndarray:
        self._check_built()
        x = np.asarray(x)
        T, D, H = self.steps, self.width, self.num_heads
        if x.ndim != 3 or x.shape[1:] != (T, D):
            raise ValueError(f"MultiHeadAttention {self.name!r} expects a batch (N, {T}, {D}), "
                             f"got an array of shape {x.shape}")
        N = x.shape[0]
        p = self.params
        x2 = _rows(x, D, self.dtype)
        qkv = np.empty((N * T, 3 * D), dtype=self.dtype)
        _dense.forward(x2, p["in_proj_weight"], p.get("in_proj_bias"), qkv)  # (N T, 3 D)
        valid = check_mask(mask, x.shape)
        m8 = None if valid is None else valid.view(np.uint8)
        P = np.empty((N, H, T, T), dtype=self.dtype)
        Pd = None
        if training and self.dropout > 0:
            Pd = self.rng.random(P.shape, dtype=self.dtype)   # uniforms, become P after dropout
        A = np.empty((N * T, D), dtype=self.dtype)
        _attention.forward(qkv, m8, self.causal, 1.0 / math.sqrt(self.head_dim), P, Pd,
                           1.0 - self.dropout, A)
        y = np.empty((N * T, D), dtype=self.dtype)
        _dense.forward(A, p["out_proj_weight"], p.get("out_proj_bias"), y)
        pad = None if valid is None or valid.all() else ~valid.reshape(-1)
        if pad is not None:
            y[pad] = 0                            # padded queries output 0
        self._x, self._qkv, self._P, self._Pd, self._A, self._pad = x2, qkv, P, Pd, A, pad
        return y.reshape(N, T, D)

    def backward(self, dy: np.ndarray) -> np.ndarray | None:
        D = self.width
        g = self.grads
        p = self.params
        d = _writable_rows(dy, D, self.dtype)
        if self._pad is not None:
            d[self._pad] = 0                      # the padded outputs are constants
        dA = np.empty_like(self._A)
        # d (N T, D) -> dW_out, db_out, dA = d W_out
        _dense.backward(self._A, p["out_proj_weight"], d, d, dA, g["out_proj_weight"],
                        g.get("out_proj_bias"))
        dqkv = np.empty_like(self._qkv)
        T = self.steps
        _attention.backward(self._qkv, 1.0 / math.sqrt(self.head_dim), self._P, self._Pd,
                            1.0 - self.dropout, dA, dqkv, np.empty((T, T), dtype=self.dtype))
        dx = np.empty_like(self._x) if self.need_input_grad else None
        # dqkv (N T, 3 D) -> dW_in, db_in, dx = dqkv W_in
        _dense.backward(self._x, p["in_proj_weight"], dqkv, dqkv, dx, g["in_proj_weight"],
                        g.get("in_proj_bias"))
        return None if dx is None else dx.reshape(dy.shape)

    def get_config(self) -> dict[str, Any]:
        return {"num_heads": self.num_heads, "key_dim": self.key_dim, "dropout": self.dropout,
                "use_bias": self.use_bias, "causal": self.causal, "name": self.name}


@register
class PositionalEmbedding(Layer):
    """Learned absolute positions: ``y[n, t] = x[n, t] + embeddings[t]``.

    A sequence model made of attention alone does not see the order of its tokens; this
    layer adds a learned vector per position (as BERT and GPT-2 do).

    Args:
        max_length: number of positions learned; the model's sequence length ``T`` must not
            exceed it (positions ``T`` and beyond are then unused).
        name: layer name.

    Input shape: ``(N, T, D)`` with ``T <= max_length``, and an optional ``(N, T)`` mask
    (passed on).  Output shape: ``(N, T, D)``.

    Parameters: ``embeddings (max_length, D)``, initialised from ``normal(0, 0.02)`` (BERT's
    and GPT-2's choice: small next to input features of unit scale; ``torch.nn.Embedding``
    draws ``normal(0, 1)``).
    """

    supports_masking = True

    def __init__(self, max_length: int, name: str | None = None) -> None:
        super().__init__(name)
        self.max_length = positive_int(max_length, "PositionalEmbedding max_length")

    def _build(self, input_shape: tuple[int, ...]) -> tuple[int, ...]:
        T, D = _sequence_shape(self, input_shape)
        if T > self.max_length:
            raise ValueError(f"PositionalEmbedding {self.name!r} learns max_length="
                             f"{self.max_length} positions, but the sequences have T={T} tokens; "
                             f"raise max_length to at least {T} or cut the sequences")
        self.steps, self.width = T, D
        return (T, D)

    def param_specs(self) -> list[ParamSpec]:
        return [("embeddings", (self.max_length, self.width))]

    def init_params(self, params: dict[str, np.ndarray], rng: np.random.Generator) -> None:
        params["embeddings"][...] = 0.02 * rng.standard_normal(params["embeddings"].shape)

    def compute_mask(self, mask: np.ndarray | None) -> np.ndarray | None:
        return mask

    def forward(self, x: np.ndarray, training: bool = False,
                mask: np.ndarray | None = None) -> np.ndarray:
        self._check_built()
        x = np.asarray(x)
        T, D = self.steps, self.width
        if x.ndim != 3 or x.shape[1:] != (T, D):
            raise ValueError(f"PositionalEmbedding {self.name!r} expects a batch (N, {T}, {D}), "
                             f"got an array of shape {x.shape}")
        return np.add(x, self.params["embeddings"][:T], dtype=self.dtype)

    def backward(self, dy: np.ndarray) -> np.ndarray | None:
        T = self.steps
        g = self.grads["embeddings"]
        np.sum(dy, axis=0, dtype=self.dtype, out=g[:T])
        g[T:] = 0
        return dy if self.need_input_grad else None

    def get_config(self) -> dict[str, Any]:
        return {"max_length": self.max_length, "name": self.name}


#: the feed-forward activations TransformerEncoder takes (PyTorch's "relu" and "gelu")
_FFN_ACTIVATIONS = ("relu", "gelu", "gelu_tanh")


@register
class TransformerEncoder(Container):
    """One Transformer encoder layer, as ``torch.nn.TransformerEncoderLayer``: self-attention
    and a position-wise feed-forward network, each with a residual connection and layer
    normalisation.

    With ``norm_first=False`` (post-norm, the original Transformer's)::

        x = norm1(x + dropout1(self_attn(x)))
        y = norm2(x + dropout2(linear2(dropout(activation(linear1(x))))))

    and with ``norm_first=True`` (pre-norm)::

        x = x + dropout1(self_attn(norm1(x)))
        y = x + dropout2(linear2(dropout(activation(linear1(norm2(x))))))

    ``self_attn`` is a :class:`MultiHeadAttention` with ``key_dim = D / num_heads`` and the
    same ``dropout`` on its attention weights; ``linear1`` / ``linear2`` are
    :class:`~sparknet.layers.Dense` layers ``D -> ffn_dim -> D`` and ``norm1`` / ``norm2``
    :class:`~sparknet.layers.LayerNormalization` layers.  The model width ``D`` is the
    input's.  The same parameters give the outputs and gradients of
    ``torch.nn.TransformerEncoderLayer(D, num_heads, ffn_dim, dropout, activation,
    layer_norm_eps=eps, batch_first=True, norm_first=norm_first)``.

    Args:
        num_heads: attention heads; must divide ``D``.
        ffn_dim: width of the feed-forward network's hidden layer.
        dropout: drop probability of the four dropouts (attention weights, attention
            output, feed-forward hidden layer and output), in ``[0, 1)``.
        activation: feed-forward activation: ``"relu"`` (default), ``"gelu"`` (exact) or
            ``"gelu_tanh"``.
        norm_first: pre-norm (``True``) instead of post-norm (``False``, default).
        eps: the layer normalisations' epsilon; positive.
        causal: token ``i`` attends to tokens ``j <= i`` only (a language model's encoder;
            torch's ``src_mask`` of ``generate_square_subsequent_mask``).
        name: layer name.

    Input shape: ``(N, T, D)`` and an optional ``(N, T)`` mask of the real tokens: padded
    tokens get no attention and the mask passes on unchanged (outputs at padded positions
    are computed but read nothing from the real tokens' and should be ignored downstream,
    as the loss and the masked pooling layers do).  Output shape: ``(N, T, D)``.

    Parameters (children's, prefixed as PyTorch's ``state_dict``): ``self_attn.*`` (see
    :class:`MultiHeadAttention`), ``linear1.kernel (ffn_dim, D)``, ``linear1.bias``,
    ``linear2.kernel (D, ffn_dim)``, ``linear2.bias``, ``norm1.gamma``, ``norm1.beta``,
    ``norm2.gamma``, ``norm2.beta``.
    """

    supports_masking = True

    def __init__(self, num_heads: int, ffn_dim: int, dropout: float = 0.1,
                 activation: str = "relu", norm_first: bool = False, eps: float = 1e-5,
                 causal: bool = False, name: str | None = None) -> None:
        super().__init__(name)
        self.causal = check_bool(causal, "TransformerEncoder causal")
        self.num_heads = positive_int(num_heads, "TransformerEncoder num_heads")
        self.ffn_dim = positive_int(ffn_dim, "TransformerEncoder ffn_dim")
        self.dropout = check_float(dropout, "TransformerEncoder dropout", 0.0, 1.0,
                                   high_open=True)
        act = activation.lower() if isinstance(activation, str) else activation
        if act not in _FFN_ACTIVATIONS:
            raise ValueError(f"TransformerEncoder activation must be one of "
                             f"{', '.join(_FFN_ACTIVATIONS)}, got {activation!r}")
        self.activation = canonical_name(act)
        self.norm_first = check_bool(norm_first, "TransformerEncoder norm_first")
        self.eps = check_float(eps, "TransformerEncoder eps", 0.0, low_open=True)

    def _build(self, input_shape: tuple[int, ...]) -> tuple[int, ...]:
        T, D = _sequence_shape(self, input_shape)
        if D % self.num_heads:
            raise ValueError(f"TransformerEncoder {self.name!r}: the model width D={D} (the "
                             f"input's last axis) is not divisible by num_heads="
                             f"{self.num_heads}")
        rate = self.dropout
        self.children = {
            "self_attn": MultiHeadAttention(self.num_heads, dropout=rate, causal=self.causal,
                                            name="self_attn"),
            "linear1": Dense(self.ffn_dim, activation=self.activation, name="linear1"),
            "dropout": Dropout(rate, name="dropout"),
            "linear2": Dense(D, name="linear2"),
            "norm1": LayerNormalization(self.eps, name="norm1"),
            "norm2": LayerNormalization(self.eps, name="norm2"),
            "dropout1": Dropout(rate, name="dropout1"),
            "dropout2": Dropout(rate, name="dropout2"),
        }
        for prefix in self.children:
            # the feed-forward hidden layer (after linear1) is ffn_dim wide, the rest D
            hidden = prefix in ("dropout", "linear2")
            self._build_child(prefix, (T, self.ffn_dim if hidden else D))
        return (T, D)

    def compute_mask(self, mask: np.ndarray | None) -> np.ndarray | None:
        return mask

    # -- computation ------------------------------------------------------
    def _attention_block(self, x: np.ndarray, training: bool, mask: np.ndarray | None
                         ) -> np.ndarray:
        """``dropout1(self_attn(x))``."""
        c = self.children
        a = cast(MaskedLayer, c["self_attn"]).forward(x, training=training, mask=mask)
        return c["dropout1"].forward(a, training=training)

    def _ffn_block(self, x: np.ndarray, training: bool) -> np.ndarray:
        """``dropout2(linear2(dropout(activation(linear1(x)))))``."""
        h = x
        for prefix in ("linear1", "dropout", "linear2", "dropout2"):
            h = self.children[prefix].forward(h, training=training)
        return h

    def _attention_back(self, d: np.ndarray) -> np.ndarray | None:
        c = self.children
        return c["self_attn"].backward(_grad(c["dropout1"].backward(d)))

    def _ffn_back(self, d: np.ndarray) -> np.ndarray | None:
        g: np.ndarray | None = d
        for prefix in ("dropout2", "linear2", "dropout", "linear1"):
            assert g is not None
            g = self.children[prefix].backward(g)
        return g

    def forward(self, x: np.ndarray, training: bool = False,
                mask: np.ndarray | None = None) -> np.ndarray:
        self._check_built()
        c = self.children
        x = np.asarray(x, dtype=self.dtype)
        n1, n2 = cast(MaskedLayer, c["norm1"]), cast(MaskedLayer, c["norm2"])
        if self.norm_first:
            h = x + self._attention_block(n1.forward(x, training=training), training, mask)
            return h + self._ffn_block(n2.forward(h, training=training), training)
        h = n1.forward(x + self._attention_block(x, training, mask), training=training)
        return n2.forward(h + self._ffn_block(h, training), training=training)

    def backward(self, dy: np.ndarray) -> np.ndarray | None:
        c = self.children
        first = c["norm1"] if self.norm_first else c["self_attn"]
        first.need_input_grad = self.need_input_grad
        try:
            if self.norm_first:
                # y = h + f(norm2(h)); h = x + a(norm1(x))
                d = np.array(dy, dtype=self.dtype, order="C", copy=True)
                dh = d + _grad(c["norm2"].backward(_grad(self._ffn_back(d.copy()))))
                da = _grad(self._attention_back(dh.copy()))
                if not self.need_input_grad:
                    c["norm1"].backward(da)
                    return None
                return dh + _grad(c["norm1"].backward(da))
            # y = norm2(h + f(h)); h = norm1(x + a(x))
            d2 = _grad(c["norm2"].backward(np.array(dy, dtype=self.dtype, copy=True)))
            dh = d2 + _grad(self._ffn_back(d2.copy()))
            d1 = _grad(c["norm1"].backward(dh))
            dx = self._attention_back(d1.copy())
            if not self.need_input_grad:
                return None
            return d1 + _grad(dx)
        finally:
            first.need_input_grad = True

    # -- (de)serialisation ------------------------------------------------
    def get_config(self) -> dict[str, Any]:
        return {"num_heads": self.num_heads, "ffn_dim": self.ffn_dim, "dropout": self.dropout,
                "activation": self.activation, "norm_first": self.norm_first, "eps": self.eps,
                "causal": self.causal, "name": self.name}


def _grad(d: np.ndarray | None) -> np.ndarray:
    """A child's input gradient, which it returns whenever it was asked for one."""
    assert d is not None, "a layer of TransformerEncoder returned no input gradient"
    return d
