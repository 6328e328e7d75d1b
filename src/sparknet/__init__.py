"""sparknet: deep networks trained on Apache Spark CPU clusters, with a Cython core.

The single-process core: :class:`~sparknet.model.Sequential` over layers from
:mod:`sparknet.layers`, losses in :mod:`sparknet.losses`, optimizers in
:mod:`sparknet.optim`, callbacks in :mod:`sparknet.callbacks` and learning-rate
schedules in :mod:`sparknet.schedules`.  Distributed training lives in :mod:`sparknet.cluster`.
"""
from sparknet._version import __version__
from sparknet.callbacks import (
    Callback,
    EarlyStopping,
    LambdaCallback,
    LearningRateScheduler,
    ModelCheckpoint,
    ReduceLROnPlateau,
)
from sparknet.io import load_model, save_model
from sparknet.layers import (
    GRU,
    LSTM,
    Activation,
    AvgPool1D,
    AvgPool2D,
    BatchNormalization,
    Bidirectional,
    ColumnEmbedding,
    Conv1D,
    Conv2D,
    Dense,
    Dropout,
    Embedding,
    Flatten,
    GlobalAveragePooling1D,
    GlobalAveragePooling2D,
    GlobalMaxPooling1D,
    GlobalMaxPooling2D,
    Layer,
    LayerNormalization,
    LeakyReLU,
    MaxPool1D,
    MaxPool2D,
    MultiHeadAttention,
    Parallel,
    PositionalEmbedding,
    Residual,
    RMSNormalization,
    SimpleRNN,
    TransformerEncoder,
    ZeroPadding1D,
    ZeroPadding2D,
)
from sparknet.losses import MeanSquaredError, SoftmaxCrossEntropy
from sparknet.model import History, Sequential
from sparknet.optim import SGD, Adam, AdamW, Optimizer, RMSprop

__all__ = [
    "SimpleRNN", "LSTM", "GRU", "Embedding", "Bidirectional",
    "Conv2D", "MaxPool2D", "AvgPool2D",
    "MultiHeadAttention", "PositionalEmbedding", "TransformerEncoder",
    "BatchNormalization", "LayerNormalization", "RMSNormalization",
    "Conv1D", "MaxPool1D", "AvgPool1D",
    "GlobalAveragePooling1D", "GlobalMaxPooling1D", "GlobalAveragePooling2D", "GlobalMaxPooling2D",
    "Residual", "Parallel", "ColumnEmbedding", "ZeroPadding1D", "ZeroPadding2D",
    "Sequential", "History", "Layer", "Dense", "Activation", "LeakyReLU", "Dropout", "Flatten",
    "SoftmaxCrossEntropy", "MeanSquaredError", "Optimizer", "RMSprop", "SGD", "Adam", "AdamW",
    "Callback", "LambdaCallback", "EarlyStopping", "ModelCheckpoint", "LearningRateScheduler",
    "ReduceLROnPlateau", "save_model", "load_model", "__version__",
]
