"""Layers.  Each module holds one family; all are re-exported here."""
from sparknet.layers.attention import MultiHeadAttention, PositionalEmbedding, TransformerEncoder
from sparknet.layers.base import REGISTRY, Layer, register
from sparknet.layers.bidirectional import Bidirectional
from sparknet.layers.conv import AvgPool2D, Conv2D, MaxPool2D
from sparknet.layers.conv1d import AvgPool1D, Conv1D, MaxPool1D
from sparknet.layers.core import Activation, Dense, Dropout, Flatten, LeakyReLU
from sparknet.layers.embedding import Embedding
from sparknet.layers.masking import SequenceMask
from sparknet.layers.normalization import (
    BatchNormalization,
    LayerNormalization,
    RMSNormalization,
)
from sparknet.layers.padding import ZeroPadding1D, ZeroPadding2D
from sparknet.layers.parallel import Parallel
from sparknet.layers.pooling import (
    GlobalAveragePooling1D,
    GlobalAveragePooling2D,
    GlobalMaxPooling1D,
    GlobalMaxPooling2D,
)
from sparknet.layers.recurrent import GRU, LSTM, SimpleRNN, reset_states
from sparknet.layers.residual import Residual
from sparknet.layers.tabular import ColumnEmbedding

__all__ = [
    "Layer", "register", "REGISTRY",
    "Dense", "Activation", "LeakyReLU", "Dropout", "Flatten",
    "Conv2D", "MaxPool2D", "AvgPool2D",
    "Conv1D", "MaxPool1D", "AvgPool1D",
    "GlobalAveragePooling1D", "GlobalMaxPooling1D", "GlobalAveragePooling2D", "GlobalMaxPooling2D",
    "SimpleRNN", "LSTM", "GRU", "Embedding", "reset_states", "Bidirectional",
    "SequenceMask",
    "MultiHeadAttention", "PositionalEmbedding", "TransformerEncoder",
    "BatchNormalization", "LayerNormalization", "RMSNormalization",
    "Residual", "Parallel", "ColumnEmbedding", "ZeroPadding1D", "ZeroPadding2D",
]
