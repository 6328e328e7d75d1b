"""Layers.  Each module holds one family; all are re-exported here."""
from sparknet.layers.base import REGISTRY, Layer, register
from sparknet.layers.core import Activation, Dense, Dropout, Flatten

__all__ = ["Layer", "register", "REGISTRY", "Dense", "Activation", "Dropout", "Flatten"]
