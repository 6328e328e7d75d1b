"""Layers.  Each module holds one family; all are re-exported here."""
from sparknet.layers.base import REGISTRY, Layer, register
from sparknet.layers.core import Activation, Dense, Dropout, Flatten

__all__ = ["Layer", "register", "REGISTRY", "Dense", "Activation", "Dropout", "Flatten"]

from sparknet.layers.conv import AvgPool2D, Conv2D, MaxPool2D  # noqa: E402
__all__ += ["Conv2D", "MaxPool2D", "AvgPool2D"]

from sparknet.layers.recurrent import LSTM, Embedding, SimpleRNN, reset_states  # noqa: E402
__all__ += ["SimpleRNN", "LSTM", "Embedding", "reset_states"]

from sparknet.layers.masking import SequenceMask  # noqa: E402
__all__ += ["SequenceMask"]
