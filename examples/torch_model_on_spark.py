"""Your PyTorch network, trained by Spark ML on a DataFrame, with no PyTorch on the executors.

    python examples/torch_model_on_spark.py [--master local[2]] [--epochs 12]

The network is an ordinary ``torch.nn.Module`` with its own ``forward()``: a stem, a
residual block, a block that halves the image with a projection shortcut (torchvision's
``downsample``), global average pooling and a linear head.  ``from_torch`` reads it into a
sparknet model (tracing ``forward()`` with ``torch.fx``), ``SparkNetClassifier`` trains
that on a DataFrame of scikit-learn's digits (the executors run sparknet's kernels and need
neither PyTorch nor a GPU), and ``to_torch`` gives the trained network back to PyTorch,
which predicts what Spark predicted.  PyTorch is needed on the driver only
(``pip install "sparknet[torch]"``).
"""
from __future__ import annotations

import argparse
import time

import numpy as np
import torch
import torch.nn.functional as F
from pyspark.ml.evaluation import MulticlassClassificationEvaluator
from pyspark.ml.linalg import Vectors
from pyspark.sql import SparkSession
from torch import nn

from sparknet.datasets import load_digits
from sparknet.interop import from_torch, to_torch
from sparknet.ml import SparkNetClassifier


class Block(nn.Module):
    """torchvision's basic block: two 3x3 convolutions, the input (or its projection) added."""

    def __init__(self, c_in: int, c: int, stride: int = 1) -> None:
        super().__init__()
        self.conv1 = nn.Conv2d(c_in, c, 3, stride=stride, padding=1, bias=False)
        self.bn1 = nn.BatchNorm2d(c)
        self.conv2 = nn.Conv2d(c, c, 3, padding=1, bias=False)
        self.bn2 = nn.BatchNorm2d(c)
        self.downsample = None
        if stride != 1 or c_in != c:
            self.downsample = nn.Sequential(nn.Conv2d(c_in, c, 1, stride=stride, bias=False),
                                            nn.BatchNorm2d(c))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        identity = x if self.downsample is None else self.downsample(x)
        out = self.bn2(self.conv2(F.relu(self.bn1(self.conv1(x)))))
        return F.relu(out + identity)


class DigitsNet(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.stem = nn.Conv2d(1, 16, 3, padding=1)
        self.block1 = Block(16, 16)
        self.block2 = Block(16, 32, stride=2)
        self.fc = nn.Linear(32, 10)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.block2(self.block1(F.relu(self.stem(x))))
        return F.softmax(self.fc(x.mean(dim=(2, 3))), dim=1)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--master", default="local[2]")
    parser.add_argument("--epochs", type=int, default=12)
    args = parser.parse_args()

    torch.manual_seed(0)
    net = DigitsNet().eval()
    model = from_torch(net, input_shape=(1, 8, 8))   # PyTorch's (C, H, W); sparknet: (8, 8, 1)
    print(model.summary())

    spark = (SparkSession.builder.master(args.master).appName("torch-model-on-spark")
             .config("spark.ui.showConsoleProgress", "false").getOrCreate())
    X_train, y_train, X_test, y_test = load_digits()
    # one vector column of 64 pixels, row by row: sparknet's (8, 8, 1) image once reshaped

    def frame(X: np.ndarray, y: np.ndarray):
        rows = [(Vectors.dense(x.astype(float)), int(label)) for x, label in zip(X, y)]
        return spark.createDataFrame(rows, ["features", "label"])

    train_df, test_df = frame(X_train, y_train), frame(X_test, y_test)
    clf = SparkNetClassifier(network=model, inputShape=[8, 8, 1], epochs=args.epochs,
                             batchSize=32, optimizer="adam", learningRate=3e-3, seed=0)
    start = time.perf_counter()
    fitted = clf.fit(train_df)
    seconds = time.perf_counter() - start
    scored = fitted.transform(test_df)
    accuracy = MulticlassClassificationEvaluator(metricName="accuracy").evaluate(scored)
    print(f"trained by Spark ({args.master}) in {seconds:.1f} s: test accuracy {accuracy:.4f}")

    back = to_torch(fitted.network)                   # the trained network, in PyTorch
    spark_pred = np.array([r.prediction for r in scored.select("prediction").collect()])
    with torch.no_grad():
        torch_pred = back(torch.from_numpy(X_test.reshape(-1, 8, 8, 1))).argmax(1).numpy()
    print(f"PyTorch predicts what Spark predicted on {np.mean(torch_pred == spark_pred):.1%} "
          f"of the test images")
    spark.stop()


if __name__ == "__main__":
    main()
