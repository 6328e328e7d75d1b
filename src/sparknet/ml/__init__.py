"""Spark ML integration: sparknet networks as ``Estimator``/``Model`` stages on DataFrames.

``SparkNetClassifier`` and ``SparkNetRegressor`` are Spark ML Estimators whose
``fit(df)`` trains a :class:`~sparknet.model.Sequential` on the cluster through
:class:`~sparknet.cluster.DataParallelTrainer`; the Models they return are
Transformers that score DataFrames on the executors, on one of two engines (the
``inferenceEngine`` Param):

- ``"arrow"``: Arrow batches through the Python workers and the Cython kernels; any
  network, any features column;
- ``"jvm"``: Java code run over each partition's rows in Spark's internal row format
  (compiled once per machine with the JDK's ``javac``, cached, and added to the session
  like SQL's ``ADD JAR``), for networks of ``Dense``, ``Activation``, ``Dropout`` and
  ``Flatten`` layers on an ML ``Vector`` column of a batch DataFrame.  It skips the
  hand-over of every row to Python, which dominates small networks;
- ``"auto"`` (default): the JVM for such networks of at most
  ``sparknet.ml._jvm.AUTO_MAX_MACS`` multiply-adds per row, where it is faster, else
  Arrow (also when no ``javac`` is found, or on Spark Connect).

They follow MLlib's conventions (``featuresCol``, ``labelCol``, ``predictionCol``,
``probabilityCol``, ``rawPredictionCol``, ``seed``; ``prediction`` a double,
``probability`` and ``rawPrediction`` ML Vectors), so they work inside ``Pipeline``,
``CrossValidator`` and with MLlib's evaluators, and they save and load with
``.write().save(path)`` / ``.load(path)`` (weights in sparknet's safe model format,
no pickle; see :mod:`sparknet.ml._persistence`).

Saves are atomic (written beside ``path``, renamed into place when complete), and a
load refuses weights that are not the ones saved with the metadata (another network's,
truncated or altered), naming both networks.

Checkpoints: with the ``checkpointDir`` Param set, ``fit`` writes a checkpoint every
``checkpointInterval`` epochs (MLlib's Param; default 1, ``-1`` none) through
:class:`sparknet.checkpoint.CheckpointStore`, the newest 3 kept; ``resume=True``
continues from the newest complete one, to ``epochs`` epochs in all: after a crash of
the driver, refit the same Estimator on the same data with ``resume=True`` (with
``syncMethod="gradient"`` the weights end as an uninterrupted fit's, bit for bit).
Use one folder per fit (not one shared by the fits of a ``CrossValidator``).

Importing this module imports pyspark; ``import sparknet`` does not.

Example::

    from pyspark.ml import Pipeline
    from pyspark.ml.feature import VectorAssembler, StandardScaler
    from sparknet import Sequential, Dense
    from sparknet.ml import SparkNetClassifier

    net = Sequential([Dense(64, activation="relu"), Dense(10, activation="softmax")])
    pipe = Pipeline(stages=[VectorAssembler(inputCols=cols, outputCol="raw"),
                            StandardScaler(inputCol="raw", outputCol="features"),
                            SparkNetClassifier(network=net, epochs=20)])
    model = pipe.fit(train_df)
    model.transform(test_df).select("prediction", "probability")
    model.write().overwrite().save("hdfs:///models/digits")

    # a long fit that can survive a driver crash: rerun the same line after it
    clf = SparkNetClassifier(network=net, epochs=200, checkpointDir="hdfs:///ckpt/digits",
                             checkpointInterval=5, resume=True)
"""
from sparknet.ml._estimators import (
           SparkNetClassificationModel,
           SparkNetClassifier,
           SparkNetRegressionModel,
           SparkNetRegressor,
)

__all__ = ["SparkNetClassifier", "SparkNetClassificationModel", "SparkNetRegressor",
           "SparkNetRegressionModel"]
