"""Layers.  Each module holds one family; all are re-exported here."""
from sparknet.layers.base import REGISTRY, Layer, register
from sparknet.layers.conv import AvgPool2D, Conv2D, MaxPool2D
from sparknet.layers.core import Activation, Dense, Dropout, Flatten
from sparknet.layers.masking import SequenceMask
from sparknet.layers.recurrent import GRU, LSTM, Embedding, SimpleRNN, reset_states

__all__ = [
    "Layer", "register", "REGISTRY",
    "Dense", "Activation", "Dropout", "Flatten",
    "Conv2D", "MaxPool2D", "AvgPool2D",
    "SimpleRNN", "LSTM", "GRU", "Embedding", "reset_states",
    "SequenceMask",
]
