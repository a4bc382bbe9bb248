"""Benchmarks of the Spark integration, each run as a module:

* :mod:`spark_integration.bench.overhead` -- Spark's overhead over the
  in-process engine (``python -m spark_integration.bench.overhead``);
* :mod:`spark_integration.bench.ship` -- broadcast vs SparkFiles for shipping
  the index (``python -m spark_integration.bench.ship``).

Importing them does not import pyspark; running them does.
"""
